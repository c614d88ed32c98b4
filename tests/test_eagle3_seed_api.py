"""The seed's decoder API as written: SpeculativeDecoder(model=<a transformers model>, parallel_degree=4,
validation_threshold=0.9), lossless at threshold 1.0 (equal to the model's own greedy generate()), and clear
ValueErrors for what it cannot take."""
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from eagle3 import SpeculativeDecoder, load_target
from eagle3_helpers import save_random_hf

PROMPTS = ["Explain photosynthesis.", "What is 17 times 23?"]
NEW = 10


@pytest.fixture(scope="module", params=["llama", "qwen2", "mistral"])
def model(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    save_random_hf(request.param, path)
    return AutoModelForCausalLM.from_pretrained(path)  # as a user would: name_or_path is the directory


@pytest.fixture(scope="module")
def reference(model):
    """The model's own greedy generate() per prompt (chat template applied), its new tokens."""
    tok = AutoTokenizer.from_pretrained(model.name_or_path)
    out = []
    for p in PROMPTS:
        enc = tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                      return_dict=True, return_tensors="pt")
        ids = model.generate(**enc, max_new_tokens=NEW, do_sample=False, pad_token_id=tok.eos_token_id)
        out.append(ids[0, enc["input_ids"].shape[1]:].tolist())
    return out


def until_eos(tokens, eos_ids):
    """generate() keeps the end-of-turn token (and may go on past one it does not know); ours stops before it."""
    return next((tokens[:i] for i, t in enumerate(tokens) if t in eos_ids), tokens)


def test_seed_snippet_runs_unchanged(model, reference):
    decoder = SpeculativeDecoder(model=model, parallel_degree=4, validation_threshold=0.9)
    results = decoder.generate(PROMPTS, max_new_tokens=NEW)
    assert len(results) == len(PROMPTS)
    engine = decoder.target.model
    assert engine.embed_tokens.weight.dtype == torch.float32  # the model's own dtype, not the hardware default
    assert engine.config.num_hidden_layers == model.config.num_hidden_layers
    for r, ref in zip(results, reference):
        assert 0 < len(r.token_ids) <= NEW
        assert r.text == decoder.target.decode(r.token_ids)
        # Relaxed acceptance applies to drafted tokens only: the first token is the target's own greedy choice.
        assert r.token_ids[0] == ref[0]


def test_threshold_one_is_lossless(model, reference):
    """At threshold 1.0: speculative == vanilla == transformers' generate(do_sample=False), token for token."""
    decoder = SpeculativeDecoder(model=model, parallel_degree=4, validation_threshold=1.0, adaptive=False)
    spec = decoder.generate(PROMPTS, max_new_tokens=NEW)
    assert decoder.last_stats["rounds"] > 0  # trees were drafted and verified
    plain = decoder.generate(PROMPTS, max_new_tokens=NEW, speculative=False)
    for s, v, ref in zip(spec, plain, reference):
        assert s.token_ids == v.token_ids == until_eos(ref, decoder.target.eos_ids)


def test_positional_directory_and_tokenizer(tmp_path):
    """The model positionally (was an AttributeError), a model directory, and a model without a name_or_path whose
    tokenizer is passed in."""
    model = save_random_hf("llama", tmp_path)
    assert model.name_or_path == ""
    with pytest.raises(ValueError, match="tokenizer"):
        SpeculativeDecoder(model=model)
    tok = AutoTokenizer.from_pretrained(tmp_path)
    want = SpeculativeDecoder(model=model, tokenizer=tok).generate(PROMPTS[:1], max_new_tokens=4)[0].token_ids
    assert len(want) == 4
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert SpeculativeDecoder(loaded).generate(PROMPTS[:1], max_new_tokens=4)[0].token_ids == want
    assert SpeculativeDecoder(model=str(tmp_path)).target.config.num_hidden_layers == model.config.num_hidden_layers


def _gpt2():
    return GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=300, n_positions=64)).eval()


def test_unsupported_architectures(tmp_path):
    with pytest.raises(ValueError, match="'gpt2' models are not supported"):
        SpeculativeDecoder(model=_gpt2(), parallel_degree=4, validation_threshold=0.9)
    _gpt2().save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="'gpt2' models are not supported"):
        SpeculativeDecoder(model=str(tmp_path))
    small = dict(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2)
    scaled = LlamaForCausalLM(LlamaConfig(**small, rope_scaling={"rope_type": "linear", "factor": 2.0}))
    with pytest.raises(ValueError, match="rope scaling 'linear'"):
        SpeculativeDecoder(model=scaled)
    with pytest.raises(ValueError, match="activation 'gelu'"):
        SpeculativeDecoder(model=LlamaForCausalLM(LlamaConfig(**small, hidden_act="gelu")))
    with pytest.raises(ValueError, match="output layer"):
        SpeculativeDecoder(model=LlamaForCausalLM(LlamaConfig(**small)).model)  # the bare LlamaModel


@pytest.mark.parametrize("kwargs,field", [
    (dict(model=42), "model: expected"), (dict(model=object()), "model: expected"), (dict(), "model"),
    (dict(target=None), "model"), (dict(target=[1, 2]), "target: expected"),
    (dict(model="tiny", tokenizer="x"), "tokenizer"),
])
def test_wrong_types(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SpeculativeDecoder(**kwargs)


def test_target_and_model_together():
    t = load_target("tiny")
    with pytest.raises(ValueError, match="model"):
        SpeculativeDecoder(t, model=t)
    assert SpeculativeDecoder(model=t).target is t and SpeculativeDecoder(target=t).target is t

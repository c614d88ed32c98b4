"""EAGLE-3 checkpoint layout: names, shapes, config and a save -> load -> save round trip."""
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from eagle3 import Eagle3Head, HeadConfig, SpeculativeDecoder
from eagle3_helpers import random_prompts, small_vocab_target

EAGLE3_NAMES = {
    "fc.weight", "midlayer.hidden_norm.weight", "midlayer.input_layernorm.weight",
    "midlayer.post_attention_layernorm.weight", "midlayer.self_attn.q_proj.weight", "midlayer.self_attn.k_proj.weight",
    "midlayer.self_attn.v_proj.weight", "midlayer.self_attn.o_proj.weight", "midlayer.mlp.gate_proj.weight",
    "midlayer.mlp.up_proj.weight", "midlayer.mlp.down_proj.weight", "norm.weight", "lm_head.weight", "d2t", "t2d",
}


def _head(draft_vocab=40, vocab=100, hidden=32):
    c = HeadConfig(hidden_size=hidden, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                   vocab_size=vocab, draft_vocab_size=draft_vocab)
    h = Eagle3Head.random(c, seed=1)
    h.set_vocab(torch.randperm(vocab, generator=torch.Generator().manual_seed(0))[:draft_vocab])
    return h


def test_layout_matches_released_eagle3_heads(tmp_path):
    h = _head()
    h.save_pretrained(tmp_path)
    sd = load_file(str(tmp_path / "model.safetensors"))
    assert set(sd) == EAGLE3_NAMES
    assert sd["fc.weight"].shape == (32, 96)
    assert sd["midlayer.self_attn.q_proj.weight"].shape == (32, 64)  # reads concat(embedding, hidden)
    assert sd["midlayer.self_attn.k_proj.weight"].shape == (16, 64)
    assert sd["lm_head.weight"].shape == (40, 32)
    assert sd["d2t"].dtype == torch.int64 and sd["d2t"].shape == (40,)
    assert sd["t2d"].dtype == torch.bool and int(sd["t2d"].sum()) == 40
    assert sd["fc.weight"].dtype == torch.float16
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["draft_vocab_size"] == 40
    assert cfg["num_hidden_layers"] == 1 and cfg["vocab_size"] == 100


def test_d2t_maps_draft_ids_to_target_ids():
    h = _head()
    ids = torch.nonzero(h.t2d).flatten()
    assert torch.equal(h.to_target_ids(torch.arange(40)), ids)


def test_round_trip(tmp_path):
    h = _head()
    h.save_pretrained(tmp_path / "a")
    h2 = Eagle3Head.from_pretrained(tmp_path / "a")
    h2.save_pretrained(tmp_path / "b")
    a, b = load_file(str(tmp_path / "a/model.safetensors")), load_file(str(tmp_path / "b/model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    for k, v in h.state_dict().items():
        assert torch.allclose(v.float(), h2.state_dict()[k].float(), atol=1e-3), k


def test_loads_a_release_style_checkpoint(tmp_path):
    """A released head may ship the target's embedding and, with a full draft vocabulary, no d2t/t2d."""
    h = _head(draft_vocab=100)
    sd = {k: v for k, v in h.state_dict().items() if k not in ("d2t", "t2d")}
    sd["embed_tokens.weight"] = torch.zeros(100, 32)
    save_file({k: v.contiguous() for k, v in sd.items()}, str(tmp_path / "model.safetensors"))
    cfg = h.config.to_dict()
    cfg.pop("draft_vocab_size")
    cfg.pop("target_hidden_size")
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    h2 = Eagle3Head.from_pretrained(tmp_path)
    assert h2.config.draft_vocab_size == 100 and bool(h2.t2d.all()) and int(h2.d2t.abs().sum()) == 0


def test_reduced_vocab_head_decodes_losslessly(tmp_path):
    target = small_vocab_target(vocab=8)
    c = HeadConfig.for_target(target.config, draft_vocab_size=5)
    head = Eagle3Head.random(c, seed=2, scale=0.3)
    head.set_vocab(torch.tensor([0, 2, 3, 5, 7]))
    head.save_pretrained(tmp_path)
    dec = SpeculativeDecoder(target, draft=str(tmp_path), parallel_degree=3, depth=3, total_tokens=10, adaptive=False)
    prompts = random_prompts(12, 8, seed=4)
    van = dec.generate_ids(prompts, max_new_tokens=16, speculative=False)
    spec = dec.generate_ids(prompts, max_new_tokens=16, batch_size=4)
    assert [r.token_ids for r in spec] == [r.token_ids for r in van]
    assert dec.last_stats["accept_length"] > 1.1


def test_head_for_another_target_is_refused():
    target = small_vocab_target(vocab=8)
    with pytest.raises(ValueError, match="draft"):
        SpeculativeDecoder(target, draft=_head())


def test_restricting_the_draft_vocabulary_keeps_the_most_frequent_tokens_and_their_rows():
    from bench.vocab import restrict
    h = _head()
    ids = h.to_target_ids(torch.arange(40))
    counts = torch.zeros(100, dtype=torch.long)
    counts[ids] = torch.arange(40) * 7 % 41 + 1  # distinct counts, not in id order
    small = restrict(h, counts, 10)
    kept = small.to_target_ids(torch.arange(10))
    assert set(kept.tolist()) == set(ids[counts[ids].topk(10).indices].tolist())
    assert torch.equal(kept, kept.sort().values) and int(small.t2d.sum()) == 10
    rows = {int(t): h.lm_head.weight[i] for i, t in enumerate(ids)}
    assert all(torch.equal(small.lm_head.weight[i], rows[int(t)]) for i, t in enumerate(kept))
    assert torch.equal(small.fc.weight, h.fc.weight)

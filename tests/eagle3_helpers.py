"""Small random targets for the decoder tests (float64, so fp rounding never flips an argmax)."""
import random
import shutil

import torch

from eagle3 import SpeculativeDecoder
from eagle3.budget import PLAIN, DraftBudget
from eagle3.draft import Eagle3Head, HeadConfig
from eagle3.layers import int8_linears
from eagle3.quant import quantize_layers_q4
from eagle3.tree import prune
from eagle3.target import ByteTokenizer, Target, _default_model_dir, random_model, tiny_config


def small_vocab_target(vocab=8, layers=4, seed=0, scale=0.3, max_pos=512, dtype=torch.float64, int8=False, int4=None):
    """A tiny Llama over a tiny vocabulary: an untrained draft head guesses its tokens often, so multi-token
    acceptance (and the KV commit that goes with it) happens in every test. dtype bf16: the engine's reduced-precision
    CPU path (int4 layers, fp32 residual stream, row-invariant attention: eagle3/attention.py's fp32 kernel, float64
    where it does not build), as the default target runs on bf16 CPUs.
    int8 (with dtype fp32): the AVX2 path (fbgemm int8 linears with per-row activation scales, the same attention).
    int4 (default: with bf16): Q4_1 layers; with fp32, the path of CPUs with AVX512-VNNI but no BF16 (eagle3/vnni.py)."""
    cfg = tiny_config(vocab=vocab, layers=layers, max_pos=max_pos)
    cfg.eos_token_ids = []
    model = random_model(cfg, seed=seed, scale=scale, dtype=dtype).pack()
    if dtype == torch.bfloat16 if int4 is None else int4:
        quantize_layers_q4(model)
    if int8:
        int8_linears(model, lm_head_digits=2)
    return Target(model, ByteTokenizer(), f"tiny-v{vocab}")


def decoder_for(target, seed=0, **kw):
    """A decoder with an untrained head that always uses the given tree (adaptive shrinking off)."""
    head = Eagle3Head.random(HeadConfig.for_target(target.config), seed=seed, scale=0.3)
    return SpeculativeDecoder(target, draft=head, **{"adaptive": False, **kw})


def random_prompts(n, vocab, seed=0, min_len=1, max_len=24):
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(min_len, max_len + 1, (n,), generator=g).tolist()
    return [torch.randint(0, vocab, (L,), generator=g).tolist() for L in lens]


def save_random_hf(kind, path):
    """A small random transformers Llama / Qwen2 / Mistral causal LM (float32) saved in `path` with the default
    model's tokenizer and chat template; returns the model."""
    import transformers

    cfg_cls, model_cls = {"llama": ("LlamaConfig", "LlamaForCausalLM"), "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
                          "mistral": ("MistralConfig", "MistralForCausalLM")}[kind]
    cfg = getattr(transformers, cfg_cls)(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                         rope_theta=5000.0, tie_word_embeddings=(kind == "qwen2"))
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(cfg).eval()
    model.save_pretrained(path)
    source = _default_model_dir()  # converted from the embedded GGUF on first use
    for f in [*source.glob("tokenizer*"), *source.glob("chat_template*")]:
        shutil.copy(f, path)
    return model


class ScriptedBudget(DraftBudget):
    """Switches between plain steps, every draft depth and every trimmed size in a fixed pseudo-random order: the
    worst case for the head's catch-up after plain steps and for trees cut down to a few nodes."""

    def __init__(self, configured, seed=0):
        super().__init__(configured)
        self.rng = random.Random(seed)
        self.shapes = []

    def plan(self, rows, greedy):
        d = self.rng.choice([PLAIN, PLAIN, *range(1, self.depth + 1)])
        self.shapes.append(d)
        return PLAIN if d is PLAIN else (self.k, d, self.total)

    def trim(self, tree, greedy):
        n = self.rng.randint(1, tree.size)
        keep = torch.arange(n).expand(len(tree.tokens), n)  # node order keeps parents first: a closed subset
        return prune(tree, keep)


def q4_weight(n, k, seed=0):
    """A random Q4_1 weight: q [n, k] in 0..15, fp16-exact d and m [n, k/32] (w = q * d + m), for the int4 kernels."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (n, k), generator=g, dtype=torch.int32)
    d = (torch.rand(n, k // 32, generator=g) * 0.01).half().float()
    m = (torch.rand(n, k // 32, generator=g) * 0.1 - 0.08).half().float()
    return q, d, m


def q4_linear(k=576, n=192, group=32, dtype=torch.bfloat16):
    """A Linear (bf16 unless `dtype` says otherwise) with random weights re-quantised to Q4_1 (whichever int4 kernel
    this CPU runs for that dtype takes it)."""
    from eagle3.layers import Linear
    from eagle3.quant import quantize_q4

    torch.manual_seed(0)
    lin = Linear(k, n).to(dtype)
    lin.weight.data.normal_(0, 0.05)
    quantize_q4(lin, group)
    return lin


def pick_avx2_build(monkeypatch):
    """From here to the test's end the engine picks the VNNI kernel's AVX2 build (EAGLE3_VNNI=avx2), as a CPU with AVX2
    alone does; skips the test where that build does not run."""
    import functools

    import pytest

    from eagle3 import vnni

    if not vnni.builds("avx2"):
        pytest.skip("the kernel's AVX2 build does not run on this CPU")
    monkeypatch.setenv("EAGLE3_VNNI", "avx2")
    monkeypatch.setattr(vnni, "kind", functools.lru_cache(maxsize=1)(vnni.kind.__wrapped__))  # undone after the test


def compiled_gives_eager_bits(lin) -> bool:
    """Whether a compiled graph around the Linear returns the eager call's bits (its kernel's fake and real op agree)."""
    f = torch.compile(lambda x: lin(x) * 2, dynamic=True)
    x = torch.randn(7, lin.weight.shape[1], dtype=torch.bfloat16)
    with torch.no_grad():
        return torch.equal(f(x), lin(x) * 2)


def close_to_dense(lin, rtol=0.03, dtype=torch.bfloat16) -> bool:
    """Whether the Linear's kernel computes (about) the product of its dense weight, on 5 random rows."""
    x = torch.randn(5, lin.weight.shape[1], dtype=dtype)
    with torch.no_grad():
        return torch.allclose(lin(x).float(), torch.nn.functional.linear(x.float(), lin.weight.float()), atol=0.03,
                              rtol=rtol)


def q8_weight(n, k, seed=4):
    """A random Q8_0 weight: q [n, k] int8 and fp16-exact d [n, k/32] (w = q * d)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(-128, 128, (n, k), generator=g).to(torch.int8)
    return q, (torch.rand(n, k // 32, generator=g) * 0.002).half().float()


def same_bits_in_any_split(mm, x, spans):
    """Whether mm(x[lo:hi]) has the bits of mm(x)[lo:hi] for every (lo, hi) in spans: row-invariance."""
    full = mm(x)
    return all(torch.equal(mm(x[lo:hi].clone()), full[lo:hi]) for lo, hi in spans)

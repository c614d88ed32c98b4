"""The VNNI int4 kernel (eagle3/vnni.py): the GGUF block's product with 8-bit activation blocks, each row's bits
independent of the rows beside it, the same bits compiled, and the engine falling back to torch's kernel where it
cannot run. The kernel takes bf16 or fp32 activations (the engine's dtype on CPUs with and without AVX512-BF16); its
AVX2 build fp32 ones, with the same bits. The kernel tests need a CPU with AVX512-VNNI or AVX2 (and a compiler); the
fallback test runs everywhere."""
import pytest
import torch

from eagle3 import amx, hardware, vnni
from eagle3.layers import Linear, weight_format
from eagle3_helpers import (close_to_dense, compiled_gives_eager_bits, decoder_for, pick_avx2_build, q4_linear,
                            q4_weight, q8_weight, random_prompts, same_bits_in_any_split, small_vocab_target)

needs_vnni = pytest.mark.skipif(not vnni.available(), reason="neither build runs on this CPU (torch's int4 runs)")
# (build, activation dtype): the VNNI build takes bf16 and fp32, the AVX2 one fp32
BUILDS = pytest.mark.parametrize("build, dtype", [
    pytest.param(b, dt, id=f"{b}-{str(dt)[6:]}",
                 marks=pytest.mark.skipif(not vnni.builds(b), reason=f"the {b} build does not run on this CPU"))
    for b, dt in (("vnni", torch.bfloat16), ("vnni", torch.float32), ("avx2", torch.float32))])


def output_rtol(dtype):
    """The output's own rounding: bf16's 8 bits, or fp32 sums of a few hundred products."""
    return 2 ** -8 if dtype == torch.bfloat16 else 1e-5


@BUILDS
@pytest.mark.parametrize("digits", [1, 2])
def test_kernel_computes_the_q4_1_product_of_quantised_rows(digits, build, dtype):
    """y = quantised x @ (q * d + m)^T: within output rounding of the float64 product of the integer blocks the
    kernel makes of x. One 8-bit digit (llama.cpp's activations) is close to the product of x itself; two digits are
    as close as the bf16 product's own rounding."""
    q, d, m = q4_weight(192, 576)
    x = torch.randn(21, 576, generator=torch.Generator().manual_seed(1)).to(dtype)
    y = vnni.mm(x, *vnni.pack_q4(q, d, m), digits=digits, build=build)
    X, dx = vnni.quantise(x, digits)
    w = q.double() * d.double().repeat_interleave(32, 1) + m.double().repeat_interleave(32, 1)
    ref = (X.double() * dx.double().repeat_interleave(32, 1)) @ w.t()
    assert y.dtype == dtype and y.shape == (21, 192)
    assert torch.allclose(y.double(), ref, rtol=output_rtol(dtype), atol=1e-3 if dtype == torch.bfloat16 else 1e-6)
    exact = x.double() @ w.t()
    err = (y.double() - exact).abs().max() / exact.abs().max()
    assert err < (0.02 if digits == 1 else 2 ** -8)


@BUILDS
@pytest.mark.parametrize("digits", [1, 2])
def test_a_row_gets_the_same_bits_at_any_row_count(digits, build, dtype):
    """Rows 1..40 in one call or split as a verify forward or a batch splits them (across 4-row groups, remainders
    of 1-3): identical bits."""
    q, d, m = q4_weight(128, 1536, seed=2)
    w = vnni.pack_q4(q, d, m)
    scales = torch.logspace(-2, 2, 40)[:, None]  # rows of very different sizes
    x = (torch.randn(40, 1536, generator=torch.Generator().manual_seed(3)) * scales).to(dtype)
    x[7, :64] = 0  # all-zero blocks quantise to zero
    full = vnni.mm(x, *w, digits=digits, build=build)
    for lo, hi in ((0, 1), (5, 6), (0, 3), (3, 19), (16, 17), (7, 40), (0, 33), (2, 4), (1, 6)):
        assert torch.equal(vnni.mm(x[lo:hi].clone(), *w, digits=digits, build=build), full[lo:hi]), (lo, hi)
    assert torch.equal(vnni.mm(x.view(4, 10, 1536), *w, digits=digits, build=build), full.view(4, 10, 128))


@needs_vnni
def test_compiled_graphs_give_eager_bits(monkeypatch):
    monkeypatch.setattr(amx, "available", lambda: False)
    lin = q4_linear(dtype=torch.bfloat16 if vnni.kind() == "vnni" else torch.float32)  # the AVX2 build: fp32 only
    assert lin._vnni is not None and lin._int4 is None
    assert compiled_gives_eager_bits(lin)


def test_the_build_follows_the_cpu(monkeypatch):
    """The VNNI build where the CPU has AVX512-VNNI, else the AVX2 one; EAGLE3_VNNI picks AVX2's or none."""
    flags = hardware.cpu_flags()
    assert vnni.kind() == ("vnni" if vnni.builds("vnni") else "avx2" if vnni.builds("avx2") else None)
    assert vnni.builds("vnni") <= ({"avx512_vnni", "avx512bw"} <= flags)
    assert vnni.builds("avx2") <= ({"avx2", "fma", "f16c"} <= flags)
    for env, expect in (("0", None), ("avx2", "avx2" if vnni.builds("avx2") else None)):
        monkeypatch.setenv("EAGLE3_VNNI", env)
        vnni.kind.cache_clear()
        assert vnni.kind() == expect
    vnni.kind.cache_clear()


def test_linears_run_the_vnni_kernel_exactly_where_it_is_available(monkeypatch):
    """Without AMX, a bf16 q4 Linear takes the VNNI kernel where it runs (the GGUF's blocks of 32 inputs) and torch's
    int4 kernel elsewhere (the AVX2 build takes fp32 alone); both compute close to its dense weight's product."""
    monkeypatch.setattr(amx, "available", lambda: False)
    for group, expect in ((32, vnni.kind() == "vnni"), (64, False)):  # groups of 64: not the kernel's blocks
        lin = q4_linear(256, 192, group)
        assert (lin._vnni is not None) == expect and (lin._int4 is not None) == (not expect)
        assert close_to_dense(lin)
    monkeypatch.setattr(vnni, "available", lambda: False)  # EAGLE3_VNNI=0 or a CPU without either build
    lin = q4_linear(256, 192)
    assert lin._vnni is None and lin._int4 is not None
    assert weight_format(torch.nn.ModuleDict(dict(a=lin))) == "int4"


@pytest.mark.parametrize("build", ["own", "avx2"])
def test_fp32_linears_run_the_vnni_kernel_where_it_is_available(build, monkeypatch):
    """fp32 weights (CPUs without AVX512-BF16) take the kernel too, either build, with fp32 activations and outputs;
    without it they keep the dense fp32 weight (torch's int4 kernel has no fp32 fast path), set to the Q4_1 values."""
    if build == "avx2":
        pick_avx2_build(monkeypatch)
    monkeypatch.setattr(amx, "available", lambda: False)
    lin = q4_linear(dtype=torch.float32)
    assert (lin._vnni is not None) == vnni.available() and lin._int4 is None
    assert close_to_dense(lin, dtype=torch.float32)
    if vnni.available():
        assert lin._vnni[3] == vnni.kind() and lin(torch.randn(3, 576)).dtype == torch.float32
        assert weight_format(torch.nn.ModuleDict(dict(a=lin))) == f"int4 ({vnni.kind().upper()} kernel)"
    monkeypatch.setattr(vnni, "available", lambda: False)
    lin = q4_linear(dtype=torch.float32)
    assert lin._vnni is None and lin._int4 is None and close_to_dense(lin, dtype=torch.float32)


@BUILDS
def test_q8_kernel_computes_the_q8_0_product_with_invariant_rows(build, dtype):
    """The lm_head's Q8_0 blocks (stored as q + 128 with m = -128 d): within output rounding (and the two digits'
    quantisation of x) of the product of the block's exact weights, rows invariant."""
    q, d = q8_weight(256, 576)
    w = vnni.pack_q8(q, d)
    x = torch.randn(37, 576, generator=torch.Generator().manual_seed(5)).to(dtype)
    ref = x.double() @ (q.double() * d.double().repeat_interleave(32, 1)).t()
    assert torch.allclose(vnni.mm(x, *w, build=build).double(), ref, rtol=2 ** -8, atol=1e-3)
    assert same_bits_in_any_split(lambda x: vnni.mm(x, *w, build=build), x, ((0, 1), (3, 5), (1, 17), (16, 37)))


@pytest.mark.skipif(not (vnni.builds("vnni") and vnni.builds("avx2")), reason="needs a CPU with AVX512-VNNI")
@pytest.mark.parametrize("digits", [1, 2])
def test_the_avx2_build_gives_the_vnni_builds_bits(digits):
    """The AVX2 build sums the same integers and does the same float operations in the same order: on a CPU that
    runs both, identical outputs for Q4_1 and Q8_0 blocks (the drift measured for one holds for the other)."""
    x = torch.randn(23, 1536, generator=torch.Generator().manual_seed(6)) * torch.logspace(-2, 2, 23)[:, None]
    for w in (vnni.pack_q4(*q4_weight(64, 1536, seed=3)), vnni.pack_q8(*q8_weight(64, 1536))):
        assert torch.equal(vnni.mm(x, *w, digits, build="avx2"), vnni.mm(x, *w, digits, build="vnni"))


def test_the_draft_head_follows_the_targets_own_kernel(monkeypatch):
    """Beside a target whose linears run an own kernel, the decoder's head gets Q4_1 linears (about a quarter of its
    bf16 bytes per draft step) on a copy: the caller's head keeps its weights, and decoding stays lossless."""
    from eagle3 import Eagle3Head, HeadConfig
    from eagle3.decoder import resolve_head

    target = small_vocab_target(dtype=torch.bfloat16)
    own = target.model.layers[0].mlp.down_proj._vnni is not None or target.model.layers[0].mlp.down_proj._amx is not None
    head = Eagle3Head.random(HeadConfig.for_target(target.config), seed=1)
    before = {k: v.clone() for k, v in head.state_dict().items()}
    used = resolve_head(target, head)
    assert any(m._vnni is not None or m._amx is not None for m in used.modules() if isinstance(m, Linear)) == own
    assert all(torch.equal(v, before[k]) for k, v in head.state_dict().items())
    dec = decoder_for(target, parallel_degree=2, depth=3, total_tokens=6)
    prompts = random_prompts(12, target.config.vocab_size, seed=5)
    vanilla = dec.generate_ids(prompts, max_new_tokens=16, speculative=False, batch_size=1)
    assert [r.token_ids for r in dec.generate_ids(prompts, max_new_tokens=16, batch_size=3)] == \
        [r.token_ids for r in vanilla]


def test_digits_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("EAGLE3_VNNI_DIGITS", "1")
    assert vnni.digits() == 1
    monkeypatch.delenv("EAGLE3_VNNI_DIGITS")
    assert vnni.digits() == 2
    monkeypatch.setenv("EAGLE3_VNNI_DIGITS", "3")
    with pytest.raises(ValueError, match="EAGLE3_VNNI_DIGITS"):
        vnni.digits()

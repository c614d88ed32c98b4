"""The AMX int4 kernel (eagle3/amx.py): the GGUF block's product, each row's bits independent of the rows beside it,
the same bits compiled, and the engine falling back to torch's kernel where it cannot run. The kernel tests need a
CPU with AMX (and a compiler); the fallback test runs everywhere."""
import pytest
import torch

from eagle3 import amx, hardware, vnni
from eagle3_helpers import (close_to_dense, compiled_gives_eager_bits, q4_linear, q4_weight, q8_weight,
                            same_bits_in_any_split)

needs_amx = pytest.mark.skipif(not amx.available(), reason="this CPU has no usable AMX-BF16 (aten's int4 kernel runs)")


@needs_amx
def test_kernel_computes_the_q4_1_product():
    """y = x @ (q * d + m)^T with the weight rounded to bf16 once, summed in fp32: within bf16 output rounding of the
    float64 product with that weight, which is also the weight the Linear keeps as its dense copy."""
    q, d, m = q4_weight(192, 576)
    x = torch.randn(21, 576, generator=torch.Generator().manual_seed(1)).bfloat16()
    y = amx.mm(x, *amx.pack_q4(q, d, m))
    w = amx.dense(q, d, m)
    ref = x.double() @ w.double().t()
    assert y.dtype == torch.bfloat16 and y.shape == (21, 192)
    assert torch.allclose(y.double(), ref, rtol=2 ** -8, atol=1e-3)
    naive = x.double() @ (q.double() * d.double().repeat_interleave(32, 1) + m.double().repeat_interleave(32, 1)).t()
    assert (y.double() - naive).abs().max() < 0.05 * naive.abs().max()  # and w is the block's real weight


@needs_amx
def test_a_row_gets_the_same_bits_at_any_row_count():
    """Rows 1..40 in one call or split in every way a verify forward or a batch splits them (across 16-row tiles,
    remainder tiles of any size): identical bits."""
    q, d, m = q4_weight(128, 1536, seed=2)
    w = amx.pack_q4(q, d, m)
    scales = torch.logspace(-2, 2, 40)[:, None]  # rows of very different sizes
    x = (torch.randn(40, 1536, generator=torch.Generator().manual_seed(3)) * scales).bfloat16()
    full = amx.mm(x, *w)
    for lo, hi in ((0, 1), (5, 6), (0, 3), (3, 19), (16, 17), (7, 40), (0, 33), (20, 36)):
        assert torch.equal(amx.mm(x[lo:hi].clone(), *w), full[lo:hi]), (lo, hi)
    assert torch.equal(amx.mm(x.view(4, 10, 1536), *w), full.view(4, 10, 128))  # leading dims are rows


@needs_amx
def test_compiled_graphs_give_eager_bits():
    lin = q4_linear()
    assert lin._amx is not None and lin._int4 is None
    assert compiled_gives_eager_bits(lin)


def test_linears_run_the_amx_kernel_exactly_where_it_is_available(monkeypatch):
    """A q4 Linear takes the AMX kernel where it runs (shapes in whole 64-column sets) and torch's int4 kernel
    elsewhere; both compute its dense weight's product."""
    torch.manual_seed(0)
    monkeypatch.setattr(vnni, "available", lambda: False)  # the other own kernel (tests/test_vnni.py)
    flags_ok = {"amx_bf16", "avx512_bf16"} <= hardware.cpu_flags()
    assert amx.available() <= flags_ok  # never claimed without the CPU flags
    for n, expect_amx in ((192, amx.available()), (96, False)):  # 96 columns: not whole sets of 64
        lin = q4_linear(256, n)
        assert (lin._amx is not None) == expect_amx and (lin._int4 is not None) == (not expect_amx)
        assert close_to_dense(lin, rtol=0.02)
    monkeypatch.setattr(amx, "available", lambda: False)  # EAGLE3_AMX=0 or a CPU without AMX
    lin = q4_linear(256, 192)
    assert lin._amx is None and lin._int4 is not None


@needs_amx
def test_q8_kernel_computes_the_q8_0_product_with_invariant_rows():
    q, d = q8_weight(256, 576)
    w = amx.pack_q8(q, d)
    x = torch.randn(37, 576, generator=torch.Generator().manual_seed(5)).bfloat16()
    ref = x.double() @ amx.dense(q, d).double().t()
    assert torch.allclose(amx.mm(x, *w).double(), ref, rtol=2 ** -8, atol=1e-3)
    assert same_bits_in_any_split(lambda x: amx.mm(x, *w), x, ((0, 1), (3, 5), (1, 17), (16, 37)))


def test_q8_0_blocks_match_gguf_dequantisation():
    """The lm_head's Q8_0 blocks as the AMX kernel reads them give the weights gguf's own dequantisation gives, so
    the kernel's bf16 weight is the dense lm_head's, bit for bit."""
    from gguf import GGUFReader, dequantize

    from eagle3.quant import q8_0_blocks
    from eagle3.target import default_gguf

    t = next(t for t in GGUFReader(str(default_gguf())).tensors if t.name == "token_embd.weight")
    q, d = q8_0_blocks(t.data[:300])
    ref = torch.from_numpy(dequantize(t.data[:300], t.tensor_type)).float()
    assert torch.equal(q.float() * d.repeat_interleave(32, 1), ref)
    assert torch.equal(amx.dense(q, d), ref.bfloat16())

"""The target's Q4_1 linears on CPUs without AMX: an own kernel (kernels/vnni_mm.cpp) that multiplies the GGUF's 4-bit
blocks by 8-bit activation blocks in integers, as llama.cpp does. Activations and outputs are the engine's dtype:
bf16 where the CPU has AVX512-BF16, fp32 where it has VNNI alone (Cascade Lake, Ice Lake), which before this ran
fbgemm's int8 linears (eagle3/int8.py). Its AVX2 build (kernels/avx2_mm.cpp) serves CPUs with AVX2 alone, fp32: the
same packed blocks and digits, the same integer sums and float operations, so the same bits, with vpmaddubsw and
vpmaddwd for vpdpbusd (about twice the instructions per product; bench/results/linears_avx2_build.md).

Why (layers): torch's int4 kernel dequantises every weight to float, once per 4 rows, so a forward's linears cost 5.5
ms at 1 row, 13.0 at 8 and 23.5 at 16 on the 2-core AVX512 EPYC (bench/results/linears_vnni.md): a verify forward of
a few tree nodes per row cost as much as several plain steps, and trees paid neither at batch 1 nor at batch 8. Here a
weight is only unpacked (two bit operations per 64 of them), once per four rows, and each vpdpbusd sums 64 products;
the float work is one multiply-add per row, block and 16 columns: 4.3, 8.6 and 14.4 ms in the same run.

Numerics: each row's activations are quantised per block of 32 in steps of max|x| / 127, as llama.cpp's Q8 blocks,
plus (digits=2, the engine's) a second int8 digit for the rest in 128ths of a step: about 14 bits, as close to the
product of x as the bf16 product's own output rounding (tests/test_vnni.py). One digit, llama.cpp's precision, is
faster from a few rows on (bench/results/peers_avx512_digits1.md) but drifted from fp32 greedy outputs at token 9
(median; 96.8% same top-1) against token 22 (98.5%) for torch's bf16 kernel; two digits: token 12, 98.3%
(bench/results/drift_vnni.md). Integer sums are exact and blocks are added in one order, so a row's bits do not
depend on the rows beside it, as verification needs.

Built at first use by torch.utils.cpp_extension (~10 s; cached under TORCH_EXTENSIONS_DIR). Used where the AMX kernel
does not run (eagle3/amx.py) and a build does: the VNNI one where the CPU has AVX512-VNNI and AVX512-BW, else the AVX2
one (fp32 weights); EAGLE3_VNNI=0 turns both off (torch's int4 kernel then runs in bf16, fbgemm's int8 one in fp32),
EAGLE3_VNNI=avx2 picks the AVX2 build anywhere (to measure what a CPU with AVX2 alone runs)."""
import os
from functools import lru_cache
from pathlib import Path

import torch

from .attention import build

KERNELS = {  # build -> (source, flags beyond AVX-512's or AVX2's (attention.build), CPU flags it needs)
    "vnni": (Path(__file__).parent / "kernels" / "vnni_mm.cpp", ["-mavx512bw", "-mavx512vnni", "-mf16c"],
             {"avx512_vnni", "avx512bw"}),
    "avx2": (Path(__file__).parent / "kernels" / "avx2_mm.cpp", ["-mavx2", "-mfma", "-mf16c"], {"avx2", "fma", "f16c"}),
}
COLUMNS, BLOCK = 16, 32  # output columns per packed panel; inputs per Q4_1 block


def digits() -> int:
    """int8 digits per activation the engine's calls use: 2 (default, ~14 bits) or 1 (llama.cpp's 8 bits, faster from
    a few rows on); EAGLE3_VNNI_DIGITS. Speculative and plain decoding use the same, so either stays lossless."""
    value = os.environ.get("EAGLE3_VNNI_DIGITS", "2")
    if value not in ("1", "2"):
        raise ValueError(f"EAGLE3_VNNI_DIGITS must be 1 or 2, not {value!r}")
    return int(value)


@lru_cache(maxsize=None)
def builds(name: str) -> bool:
    """Whether this CPU has what build `name` needs and it builds (no compiler, or one without the intrinsics: no)."""
    from .hardware import cpu_flags

    source, flags, needs = KERNELS[name]
    if not needs <= cpu_flags():
        return False
    fallback = "trying its AVX2 build" if name == "vnni" else "using torch's int4 kernel (fbgemm's int8 in fp32)"
    if not build(f"eagle3_{name}", source, fallback, flags):
        return False
    for op in ("q4_mm", "q8_mm"):
        torch.library.register_fake(f"eagle3_{name}::{op}")(
            lambda x, w, scales, digits: x.new_empty(x.shape[0], w.shape[0] * COLUMNS))
    return True


@lru_cache(maxsize=1)
def kind() -> str | None:
    """The build q4 linears run here: "vnni" where the CPU has AVX512-VNNI, else "avx2" (the same bits, fp32 only);
    None where neither runs. EAGLE3_VNNI=0: none; EAGLE3_VNNI=avx2: the AVX2 build even where VNNI runs (to compare)."""
    choice = os.environ.get("EAGLE3_VNNI", "1")
    if choice == "0":
        return None
    for name in (("avx2",) if choice == "avx2" else ("vnni", "avx2")):
        if builds(name):
            return name
    return None


def available() -> bool:
    """Whether q4 linears run one of the kernel's builds here."""
    return kind() is not None


def label(build: str | None = None) -> str:
    """What reports call a build (default: the one that runs): "VNNI kernel" or "AVX2 kernel"."""
    return f"{(build or kind() or 'vnni').upper()} kernel"


def takes(weight: torch.Tensor) -> bool:
    """Whether a Linear with this dense weight runs the kernel: fp32 (or bf16 with VNNI) on a CPU where it runs."""
    dtypes = (torch.bfloat16, torch.float32) if kind() == "vnni" else (torch.float32,)
    return weight.device.type == "cpu" and weight.dtype in dtypes and available()


def fits(out_features: int, in_features: int, group: int) -> bool:
    return group == BLOCK and out_features % COLUMNS == 0 and in_features % BLOCK == 0


def _quads(q: torch.Tensor) -> torch.Tensor:
    """[N, K] bytes -> [N/16, K/32, 8 quad-vectors, 64]: byte 4c + e of quad-vector t is column c at input 4t + e."""
    n, k = q.shape
    quads = q.reshape(n // COLUMNS, COLUMNS, k // BLOCK, 8, 4).permute(0, 2, 3, 1, 4)
    return quads.reshape(n // COLUMNS, k // BLOCK, 8, 64)


def _per_panel(*ts):
    """Per-block scales [N, K/32] each -> [N/16, K/32, 16 * len(ts)] fp16 (each scale's 16 columns in turn)."""
    n, g = ts[0].shape
    panels = [t.reshape(n // COLUMNS, COLUMNS, g).transpose(1, 2) for t in ts]
    return torch.cat(panels, -1).to(torch.float16).contiguous()


def pack_q4(q: torch.Tensor, d: torch.Tensor, m: torch.Tensor):
    """Q4_1: q [N, K] in 0..15, d and m [N, K/32] (w = q * d + m) -> (nibbles [N/16, K/32, 256] uint8: quad-vectors
    2v and 2v + 1 in the low and high nibbles of vector v; scales [N/16, K/32, 32] fp16: the 16 columns' d, then m),
    the layout kernels/vnni_mm.cpp reads."""
    quads = _quads(q.to(torch.uint8))
    nibbles = quads[:, :, 0::2] | (quads[:, :, 1::2] << 4)
    return nibbles.reshape(*nibbles.shape[:2], -1).contiguous(), _per_panel(d, m)


def pack_q8(q: torch.Tensor, d: torch.Tensor):
    """Q8_0: q [N, K] int8, d [N, K/32] (w = q * d) -> (bytes [N/16, K/32, 512] uint8, scales [N/16, K/32, 32] fp16).
    Stored as unsigned q + 128 with m = -128 * d (exact in fp16), so that the kernel's Q4_1 formula computes it."""
    quads = _quads((q.to(torch.int16) + 128).to(torch.uint8))
    d = d.to(torch.float16)
    return quads.reshape(*quads.shape[:2], -1).contiguous(), _per_panel(d, d * -128)


def is_q4(weights: torch.Tensor) -> bool:
    return weights.shape[-1] == BLOCK // 2 * COLUMNS


def quantise(x: torch.Tensor, digits: int = 2):
    """What the kernel does to rows, in torch (for tests): (X int32 [M, K], dx [M, K/32] fp32), x ~ X * dx."""
    v = x.float().reshape(x.shape[0], -1, BLOCK)
    step = v.abs().amax(-1) / 127.0
    v = v * torch.where(step > 0, 1.0 / step, torch.zeros_like(step))[..., None]
    q1 = torch.round(v)
    if digits == 1:
        return q1.int().reshape(x.shape), step
    q2 = torch.round((v - q1) * 128.0)
    return (q1.int() * 128 + q2.int()).reshape(x.shape), step / 128.0


def mm(x: torch.Tensor, weights: torch.Tensor, scales: torch.Tensor, digits: int = 2, build: str | None = None):
    """x [..., K] bf16 or fp32 @ a packed weight^T (Q4_1 or Q8_0) -> [..., N] in x's dtype, activations in `digits`
    int8 digits, through `build` (kind(): the one that runs here)."""
    library = getattr(torch.ops, f"eagle3_{build or kind()}")
    op = library.q4_mm if is_q4(weights) else library.q8_mm
    y = op(x.reshape(-1, x.shape[-1]), weights, scales, digits)
    return y.view(*x.shape[:-1], -1)

"""The target's Q4_1 linears and Q8_0 lm_head on CPUs with AMX: an own kernel (kernels/amx_mm.cpp) whose cost barely
grows with rows.

Why (layers): torch's int4 kernel (`_weight_int4pack_mm_for_cpu`) dequantises the weights once per 4 rows, so a
forward's linears cost 6.9 ms at 1 row, 14.8 at 8 and 24.8 at 16 on the 2-core AMX Xeon (bench/results/
linears_amx.md): a 16-token verify forward cost several plain steps, and neither trees at batch 1 nor drafts inside a
batch could pay. This kernel dequantises each block of 32 inputs once per call into bf16 AMX tiles, and one tile
multiply covers 16 rows: 7.0 ms from 1 to 16 rows, 11.7 at 32, 14.4 at 64.
Why (lm_head): it was dense bf16 (56 MB a step) in fixed 16-row calls, since oneDNN's 1-row and many-row kernels
round differently on AMX; the GGUF's Q8_0 blocks through this kernel stream half the bytes and need no fixed calls
(a one-off measurement, weights in cache: 1.2 ms instead of 1.7-1.9 at 1-16 rows, 3.7 instead of 6.4 at 64).

Lossless: tiles multiply rows independently and accumulate blocks in one order, so a row's output has the same bits
whatever the number of rows in the call (tests/test_amx.py), as verification needs.

Numerics: w = q * d + m (Q4_1) or q * d (Q8_0) from the GGUF's fp16 scales and minimums, in fp32, rounded to bf16
(what the layer's dense weight holds, bit for bit); products summed in fp32 by the tiles. aten's int4 kernel instead
rounds d and m + 8d to bf16 and keeps the weight in fp32: two roundings of the same GGUF.

Built at first use by torch.utils.cpp_extension (gcc with AMX intrinsics, ~10 s; cached under TORCH_EXTENSIONS_DIR,
by default ~/.cache/torch_extensions, and rebuilt only when the source changes). Some virtual machines report AMX but
stop its tile instructions (SIGILL), which would kill the process, so a child process runs the kernel once first.
Used where the CPU has AMX-BF16 and AVX512-BF16, the kernel builds and the probe lives; elsewhere torch's int4 kernel
and the dense lm_head run. EAGLE3_AMX=0 turns it off."""
import os
import subprocess
import sys
import warnings
from functools import lru_cache
from pathlib import Path

import torch

SOURCE = Path(__file__).parent / "kernels" / "amx_mm.cpp"
FLAGS = ["-O3", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16", "-mf16c", "-mamx-tile", "-mamx-bf16",
         "-fopenmp"]
COLUMNS, BLOCK = 64, 32  # output columns per packed panel set; inputs per Q4_1 block


@lru_cache(maxsize=1)
def available() -> bool:
    """Whether q4 linears run this kernel here: the CPU has AMX-BF16, EAGLE3_AMX is not 0, and it builds."""
    from .hardware import cpu_flags

    if os.environ.get("EAGLE3_AMX", "1") == "0" or not {"amx_bf16", "avx512_bf16"} <= cpu_flags():
        return False
    try:
        library = _build()
    except Exception as e:  # no compiler, or one without AMX intrinsics: aten's int4 kernel instead
        warnings.warn(f"eagle3.amx: the AMX kernel did not build ({e}); using torch's int4 kernel")
        return False
    probe = subprocess.run([sys.executable, "-c", _PROBE, library], capture_output=True, timeout=300)
    if probe.returncode != 0:
        warnings.warn(f"eagle3.amx: the AMX kernel failed its probe (exit {probe.returncode}); "
                      "using torch's int4 kernel")
        return False
    torch.library.register_fake("eagle3_amx::q4_mm")(_fake_mm)
    torch.library.register_fake("eagle3_amx::q8_mm")(_fake_mm)
    return True


def _build() -> str:
    """Compile (or find in torch's extension cache) the kernel's shared library; its path."""
    from torch.utils.cpp_extension import _get_build_directory, load

    load(name="eagle3_amx", sources=[str(SOURCE)], extra_cflags=FLAGS, extra_ldflags=["-fopenmp"],
         is_python_module=False, verbose=False)
    return str(Path(_get_build_directory("eagle3_amx", verbose=False)) / "eagle3_amx.so")


_PROBE = """import sys, torch
torch.ops.load_library(sys.argv[1])
x, w = torch.ones(3, 32, dtype=torch.bfloat16), torch.full((1, 1, 4, 256), 0x11, dtype=torch.uint8)
y = torch.ops.eagle3_amx.q4_mm(x, w, torch.ones(1, 1, 4, 32, dtype=torch.float16))
assert bool((y == 64).all()), y"""


def _fake_mm(x, w, scales):  # shapes for torch.compile's tracing
    return x.new_empty(x.shape[0], w.shape[0] * COLUMNS)


def fits(out_features: int, in_features: int, group: int) -> bool:
    return group == BLOCK and out_features % COLUMNS == 0 and in_features % BLOCK == 0


def _lanes(t: torch.Tensor, k: int) -> torch.Tensor:
    """[N, K] -> [N/64, K/32, 4 panels, 16 k-pairs, 32 lanes]: lane i of a k-pair is column i // 2 (+ 8 from lane 16
    on) at k parity i % 2, the order kernels/amx_mm.cpp's conversion produces."""
    n = t.shape[0]
    t = t.reshape(n // COLUMNS, 4, 2, 8, k // BLOCK, BLOCK // 2, 2)  # [set, panel, half, column, block, pair, parity]
    return t.permute(0, 4, 1, 5, 2, 3, 6).reshape(n // COLUMNS, k // BLOCK, 4, BLOCK // 2, 32)


def _per_column(*ts):
    """Per-block scales [N, K/32] -> [N/64, K/32, 4, 16 * len(ts)] fp16 (a block's columns, each scale in turn)."""
    n, g = ts[0].shape
    t = torch.stack([t.reshape(n // COLUMNS, 4, 16, g) for t in ts], 3)  # [set, panel, column, which, block]
    return t.permute(0, 4, 1, 3, 2).reshape(n // COLUMNS, g, 4, 16 * len(ts)).contiguous().to(torch.float16)


def pack_q4(q: torch.Tensor, d: torch.Tensor, m: torch.Tensor):
    """Q4_1: q [N, K] in 0..15, d and m [N, K/32] (w = q * d + m) -> (nibbles [N/64, K/32, 4, 256] uint8: lanes i and
    16 + i in byte i's low and high nibble; d then m [N/64, K/32, 4, 32] fp16)."""
    lanes = _lanes(q.to(torch.uint8), q.shape[1])
    nibbles = lanes[..., :16] | (lanes[..., 16:] << 4)
    return nibbles.reshape(*nibbles.shape[:3], -1).contiguous(), _per_column(d, m)


def pack_q8(q: torch.Tensor, d: torch.Tensor):
    """Q8_0: q [N, K] int8, d [N, K/32] (w = q * d) -> (bytes [N/64, K/32, 4, 512] uint8, one per lane;
    d [N/64, K/32, 4, 16] fp16)."""
    lanes = _lanes(q.to(torch.int8), q.shape[1]).view(torch.uint8)
    return lanes.reshape(*lanes.shape[:3], -1).contiguous(), _per_column(d)


def dense(q: torch.Tensor, d: torch.Tensor, m: torch.Tensor | None = None, dtype=torch.bfloat16) -> torch.Tensor:
    """The weight the kernel multiplies by: q * d (+ m) in fp32 from fp16 d (and m), rounded once to `dtype`."""
    d = d.to(torch.float16).float().repeat_interleave(BLOCK, 1)
    if m is None:
        return (q.float() * d).to(dtype)
    return torch.addcmul(m.to(torch.float16).float().repeat_interleave(BLOCK, 1), q.float(), d).to(dtype)


def is_q4(weights: torch.Tensor, scales: torch.Tensor) -> bool:
    """Whether a packed weight is Q4_1 (16 k-pairs x 16 bytes of nibbles a block and panel) rather than Q8_0 (x 32)."""
    return weights.shape[-1] == BLOCK // 2 * 16


def mm(x: torch.Tensor, weights: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """x [..., K] bf16 @ a packed weight^T -> [..., N] bf16 (Q4_1 or Q8_0)."""
    op = torch.ops.eagle3_amx.q4_mm if is_q4(weights, scales) else torch.ops.eagle3_amx.q8_mm
    y = op(x.reshape(-1, x.shape[-1]), weights, scales)
    return y.view(*x.shape[:-1], -1)

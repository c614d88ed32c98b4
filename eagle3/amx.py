"""The target's Q4_1 linears on CPUs with AMX: an own kernel (kernels/q4_amx.cpp) whose cost barely grows with rows.

Why: torch's int4 kernel (`_weight_int4pack_mm_for_cpu`) dequantises the weights once per 4 rows, so a forward's
linears cost ~5 ms at 1 row, 12.6 at 8 and 23 at 16 (bench/results/linears_amx.md): a 16-token verify forward cost
4.5 plain steps, and neither trees at batch 1 nor drafts inside a batch could pay. This kernel dequantises each block
of 32 inputs once per call into bf16 AMX tiles, and one tile multiply covers 16 rows: 5.6-7 ms from 1 to 16 rows.

Lossless: tiles multiply rows independently and accumulate blocks in one order, so a row's output has the same bits
whatever the number of rows in the call (tests/test_amx.py), as verification needs.

Numerics: w = q * d + m from the GGUF's fp16 scale d and minimum m, in fp32, rounded to bf16 (which is what the
layer's dense weight holds, bit for bit), products summed in fp32 by the tiles. aten's kernel instead rounds d and
m + 8d to bf16 and keeps the weight in fp32, so the two paths are different roundings of the same GGUF.

Built at first use by torch.utils.cpp_extension (gcc with AMX intrinsics, ~10 s; cached under TORCH_EXTENSIONS_DIR,
by default ~/.cache/torch_extensions, and rebuilt only when the source changes). Some virtual machines report AMX but
stop its tile instructions (SIGILL), which would kill the process, so a child process runs the kernel once first.
Used where the CPU has AMX-BF16 and AVX512-BF16, the kernel builds and the probe lives; elsewhere aten's int4 kernel
runs. EAGLE3_AMX=0 turns it off."""
import os
import subprocess
import sys
import warnings
from functools import lru_cache
from pathlib import Path

import torch

SOURCE = Path(__file__).parent / "kernels" / "q4_amx.cpp"
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
        warnings.warn(f"eagle3.amx: the AMX kernel failed its probe (exit {probe.returncode}); using torch's int4 kernel")
        return False
    torch.library.register_fake("eagle3_amx::q4_mm")(_fake_mm)
    return True


def _build() -> str:
    """Compile (or find in torch's extension cache) the kernel's shared library; its path."""
    from torch.utils.cpp_extension import _get_build_directory, load

    load(name="eagle3_amx", sources=[str(SOURCE)], extra_cflags=FLAGS, extra_ldflags=["-fopenmp"],
         is_python_module=False, verbose=False)
    return str(Path(_get_build_directory("eagle3_amx", verbose=False)) / "eagle3_amx.so")


_PROBE = """import sys, torch
torch.ops.load_library(sys.argv[1])
y = torch.ops.eagle3_amx.q4_mm(torch.ones(3, 32, dtype=torch.bfloat16), torch.full((1, 1, 4, 16, 16), 0x11, dtype=torch.uint8),
                               torch.ones(1, 1, 4, 2, 16, dtype=torch.float16))
assert bool((y == 64).all()), y"""


def _fake_mm(x, w, dm):  # shapes for torch.compile's tracing
    return x.new_empty(x.shape[0], w.shape[0] * COLUMNS)


def fits(out_features: int, in_features: int, group: int) -> bool:
    return group == BLOCK and out_features % COLUMNS == 0 and in_features % BLOCK == 0


def pack(q: torch.Tensor, d: torch.Tensor, m: torch.Tensor):
    """q [N, K] in 0..15, d and m [N, K/32] (w = q * d + m) -> (nibbles [N/64, K/32, 4, 16, 16] uint8,
    dm [N/64, K/32, 4, 2, 16] fp16), the layout kernels/q4_amx.cpp reads: per 64 columns, block by block, 4 panels of
    16 columns; in a panel's k-pair, byte i holds column i // 2 at k parity i % 2 (low nibble) and column 8 + i // 2
    (high nibble)."""
    n, k = q.shape
    s, g = n // COLUMNS, k // BLOCK
    q = q.to(torch.uint8).view(s, 4, 2, 8, g, BLOCK // 2, 2)  # [set, panel, half, column, block, k-pair, parity]
    q = q.permute(0, 4, 1, 5, 2, 3, 6).reshape(s, g, 4, BLOCK // 2, 2, 16)
    nibbles = (q[..., 0, :] | (q[..., 1, :] << 4)).contiguous()
    dm = torch.stack([d.reshape(s, 4, 16, g), m.reshape(s, 4, 16, g)], 3).permute(0, 4, 1, 3, 2)
    return nibbles, dm.contiguous().to(torch.float16)


def dense(q: torch.Tensor, d: torch.Tensor, m: torch.Tensor, dtype=torch.bfloat16) -> torch.Tensor:
    """The weight the kernel multiplies by: q * d + m in fp32 from fp16 d and m, rounded once to `dtype`."""
    d, m = (t.to(torch.float16).float().repeat_interleave(BLOCK, 1) for t in (d, m))
    return torch.addcmul(m, q.float(), d).to(dtype)


def mm(x: torch.Tensor, nibbles: torch.Tensor, dm: torch.Tensor) -> torch.Tensor:
    """x [..., K] bf16 @ the packed weight^T -> [..., N] bf16."""
    y = torch.ops.eagle3_amx.q4_mm(x.reshape(-1, x.shape[-1]), nibbles, dm)
    return y.view(*x.shape[:-1], -1)

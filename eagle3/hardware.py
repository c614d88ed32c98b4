"""What this machine can do, detected at run time: the engine's dtype follows the hardware, never a hard-coded guess.

bf16 pays on a CPU only with native bf16 dot products (AVX512-BF16 or AMX): oneDNN's packed bf16 linears are then
1.3-3.3x faster than fp32 ones, while on an AVX2-only CPU bf16 is emulated and slower (CPU-PERF-NOTES.md)."""
import os
import platform
from functools import lru_cache

import torch

from .layers import has_amx, has_both_kernels, has_int4

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16, "float64": torch.float64, "fp64": torch.float64}
_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


@lru_cache(maxsize=1)
def _cpuinfo() -> dict:
    """The first processor's /proc/cpuinfo fields ({} where there is none)."""
    info = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    break
                key, _, value = line.partition(":")
                info[key.strip()] = value.strip()
    except OSError:
        pass
    return info


def cpu_flags() -> frozenset:
    return frozenset(_cpuinfo().get("flags", "").split())


def cpu_has_bf16() -> bool:
    return any(f in cpu_flags() for f in _BF16_FLAGS)


def parse_dtype(value) -> torch.dtype:
    if isinstance(value, torch.dtype):
        return value
    if isinstance(value, str) and value.lower() in DTYPES:
        return DTYPES[value.lower()]
    raise ValueError(f"dtype: {value!r} is not one of {sorted(DTYPES)}")


def default_dtype(device) -> torch.dtype:
    """EAGLE3_DTYPE if set; else bf16 on CUDA and on CPUs with native bf16, fp32 elsewhere."""
    if os.environ.get("EAGLE3_DTYPE"):
        return parse_dtype(os.environ["EAGLE3_DTYPE"])
    if torch.device(device).type == "cuda":
        return torch.bfloat16
    return torch.bfloat16 if cpu_has_bf16() else torch.float32


# Variables that limit torch's, oneDNN's and fbgemm's kernels to a smaller CPU's (bench/formats.py emulates one)
NARROWING = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "FBGEMM_ENABLE_INSTRUCTIONS")


def describe() -> str:
    """One line for benchmark reports: CPU model, the ISA torch dispatches to, the flags that decide dtype, threads,
    and the variables that narrow torch's, oneDNN's or fbgemm's kernels where a run sets them."""
    flags = [f for f in ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8") if f in cpu_flags()]
    model = _cpuinfo().get("model name") or platform.processor() or "cpu"
    gpu = f", CUDA {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ""
    narrowed = [f"{k}={os.environ[k]}" for k in NARROWING if os.environ.get(k)]
    return (f"{model}, {os.cpu_count()} cores, torch {torch.__version__} ({torch.backends.cpu.get_cpu_capability()}), "
            f"flags {' '.join(flags) or '-'}, threads {torch.get_num_threads()}{gpu}"
            + (f", kernels narrowed by {' '.join(narrowed)}" if narrowed else ""))


ROW_CHUNK_FROM = 16  # batch sizes from which a call (its prefills, steps and verify forwards) uses row chunks


def row_chunk(model) -> int | None:
    """Rows per dense GEMM call for a model with int4 layers (layers.row_chunks), or None. On CPUs with AMX, oneDNN's
    dense bf16 GEMM beats the int4 kernel at many rows and the int4 kernel wins at a few rows
    (bench/results/row_chunks.md: vanilla decode 2.1x faster at batch 64, 0.84x at batch 8), so calls with a batch
    size of ROW_CHUNK_FROM or more run dense in fixed 64-row calls, smaller batches int4. The dense weight is the int4
    values rounded to bf16, so the two modes round differently. Without AMX (AVX512-BF16 only) the dense GEMM is no
    faster at decode's row counts, and 64-row calls slowed batch-16 and batch-32 decoding
    (bench/results/row_chunks_avx512.md). Where the engine's AMX kernel runs (eagle3/amx.py), it is row-invariant and
    fast at every row count, so no chunks. Override with EAGLE3_ROW_CHUNK (rows; 0 = off)."""
    if os.environ.get("EAGLE3_ROW_CHUNK"):
        return int(os.environ["EAGLE3_ROW_CHUNK"]) or None
    return 64 if has_int4(model) and "amx_bf16" in cpu_flags() and not has_amx(model) else None


def few_rows_until(model) -> int:
    """The largest batch size whose calls run the VNNI kernel where a Linear has both of the engine's kernels
    (layers.few_rows; 0: none). On AMX CPUs the AMX kernel dequantises every weight to bf16 on each call, so its cost
    is flat from 1 to 16 rows but high at one, where the VNNI kernel's integer products are cheaper: on a 2-core AMX
    Xeon a forward's linears took 12.4 / 12.6 / 12.9 / 14.6 ms at 1 / 4 / 8 / 16 rows with the AMX kernel and 8.5 /
    9.9 / 11.8 / 24.8 with the VNNI one (bench.linears, 2026-12-07). A batch-1 call decodes plain steps and trees of
    up to 16 nodes, so it takes the VNNI kernel; batch 2 and up keep AMX. The two kernels round differently (bf16
    weights against int8 activation digits), so a prompt may decode differently at batch 1 and 2, as between dtypes;
    within a call every forward uses one kernel, so speculative output stays identical to vanilla.
    EAGLE3_FEW_ROWS overrides (a batch size; 0 = always AMX)."""
    if not has_both_kernels(model):
        return 0
    return int(os.environ.get("EAGLE3_FEW_ROWS", "1"))

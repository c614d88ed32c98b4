"""Attention on a CPU in fp32 with an own kernel (kernels/attention.cpp) whose outputs do not depend on what shares
the call, instead of float64 SDPA.

Why: lossless speculation needs a token's bits to be the same whether it is decoded alone or verified among tree
nodes. The linears and norms are row-invariant; SDPA's sums are not (their order follows the query and key counts),
so attention ran in float64, where the difference stays ~1e-16 and never reaches a bf16 rounding (layers.cache_dtype).
But float64 attention was most of a forward at batch 8 and up: on the 2-core AMX Xeon, a compiled step at a context
of 300 took 44 ms at batch 8 and 137 at batch 32 with it, 15 and 24 without attention at all. This kernel computes each
query on its own, over its visible keys in index order, so its bits are fixed by construction, in fp32, at a
fraction of that cost (bench/results/attention.md).

Built at first use by torch.utils.cpp_extension for this CPU's vector width (AVX-512 or AVX2; ~10 s, cached under
TORCH_EXTENSIONS_DIR). Used where attention would otherwise run in float64 (a CPU with bf16 weights or int8
activations), the head dim is a multiple of 16 and the kernel builds; EAGLE3_ATTENTION=0 keeps float64 SDPA."""
import os
import warnings
from functools import lru_cache
from pathlib import Path

import torch

SOURCE = Path(__file__).parent / "kernels" / "attention.cpp"
HEAD_DIMS = (16, 32, 64, 128)  # the kernel's


# The vector widths own kernels are built for, widest first: CPU flags needed -> compiler flags. Every kernel source
# must compile at each width it may meet (tests/test_kernel_sources.py), not only at the width of the machine a change
# was made on: a build that fails falls back quietly (float64 attention ran 2-3x slower on AVX-512 CPUs that way).
WIDTHS = {
    "avx512": ({"avx512f", "avx512vl", "fma"}, ["-mavx512f", "-mavx512vl", "-mfma", "-mprefer-vector-width=512"]),
    "avx2": ({"avx2", "fma"}, ["-mavx2", "-mfma"]),
    "base": (set(), []),
}


def build(name, source, fallback, extra_flags=()) -> bool:
    """Compile (or find in torch's extension cache) an own CPU kernel for this CPU's vector width: one build per width,
    so a cache shared by machines never hands one a library it cannot run. False, with a warning saying what runs
    instead (`fallback`), where it does not build (no compiler). extra_flags: instruction sets the kernel needs
    beyond the width's (its caller checks the CPU has them)."""
    from torch.utils.cpp_extension import load

    from .hardware import cpu_flags

    have = cpu_flags()
    width = next(w for w, (needs, _) in WIDTHS.items() if needs <= have)
    flags = WIDTHS[width][1]
    try:
        load(name=f"{name}_{width}", sources=[str(source)], extra_cflags=["-O3", "-fopenmp", *flags, *extra_flags],
             extra_ldflags=["-fopenmp"], is_python_module=False, verbose=False)
    except Exception as e:
        warnings.warn(f"{name}: the kernel did not build ({e}); {fallback}")
        return False
    return True


_BUILT = False  # set by available(): what runs() reads inside compiled graphs (which cannot trace the build)


@lru_cache(maxsize=1)
def available() -> bool:
    """Whether CPU attention runs this kernel: EAGLE3_ATTENTION is not 0 and it builds."""
    global _BUILT
    if os.environ.get("EAGLE3_ATTENTION", "1") == "0":
        return False
    if not build("eagle3_attention", SOURCE, "attention stays float64"):  # no compiler: float64 SDPA, as before
        return False
    torch.library.register_fake("eagle3_attention::attend")(lambda q, k, v, k2, v2, mask: q.new_empty(q.shape))
    _BUILT = True
    return True


def runs(q: torch.Tensor) -> bool:
    """Whether attention over these queries runs the kernel: fp32 on a CPU, a head dim it has, and it was built
    (available(), which every CPU model's KV cache asks for: layers.cache_dtype)."""
    return _BUILT and q.dtype == torch.float32 and q.device.type == "cpu" and q.shape[-1] in HEAD_DIMS


def attend(q, k, v, mask, k2=None, v2=None):
    """q [B, Hq, T, D], k/v [B, Hkv, S, D] fp32 (D contiguous), mask [B, 1, T, S + S2] bool -> [B, Hq, T, D].
    k2/v2 [B, Hkv, S2, D]: keys that follow k/v's (a forward's new keys after the cache's), so none are copied."""
    if k2 is None:
        k2 = v2 = k[:, :, :0]
    return torch.ops.eagle3_attention.attend(q, k, v, k2, v2, mask)

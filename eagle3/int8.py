"""int8 linears for CPUs without native bf16 (AVX2): fbgemm's int8 GEMM, with each activation row quantised on its own.

Opt-in (load_target(int8=True), EAGLE3_INT8=1): it is lossless against its own vanilla decode, but 7-bit per-row
activations change the model itself. Greedy output leaves the fp32 reference within a few tokens on most held-out
prompts (bench/results/drift_avx2.md); the activations' outlier channels, not the int8 weights, cause it. Moving
those outliers into the weights (SmoothQuant) is what would let it be the default.

Why: on such CPUs the engine runs fp32, and a batch-1 step streams 540 MB of fp32 weights; torch's int4 kernel has no
fast AVX2 path past a row or two. fbgemm's int8 GEMM streams a quarter of fp32's bytes and stays nearly flat up to
~8 rows (the kernel alone: 11.7 ms for a forward's layers at 1 row, 18.7 at 8, on a 2-core AVX2 EPYC; fp32 oneDNN
23-33 ms, bench/results/linears.md), which is what verifying a draft tree needs. The per-row scaling around it costs
~80 us a linear when run eagerly; compiled steps (eagle3/compiled.py) fuse it into the neighbouring kernels.

Why per-row scales: fbgemm's own dynamic quantisation takes one scale for the whole call, so a row's result would
depend on the rows beside it, and a verify forward's tree nodes would round differently from a plain step. Here each
row is scaled to ±ACT_LEVELS before the call (scale 1, zero point ACT_LEVELS + 1), the integer sums are exact, and
the row's scale is multiplied back: a row gets the same bits however many rows share the call.

The GEMM is a custom op over a handle (an int64 tensor naming the packed weight), so torch.compile sees an opaque call
with tensor inputs and fuses the scaling around it (eagle3/compiled.py)."""
import itertools
import weakref

import torch

# Activation levels each side of zero. fbgemm on AVX2 sums pairs of u8 x s8 products in int16 (vpmaddubsw), so
# 8-bit activations could saturate; 7 bits (as torch's own reduce_range) cannot.
ACT_LEVELS = 63

_PACKED = {}  # handle -> fbgemm's packed weight
_handles = itertools.count()


def supported(w: torch.Tensor) -> bool:
    """For fp32 weights on an x86 CPU (fbgemm)."""
    fbgemm = "fbgemm" in torch.backends.quantized.supported_engines
    return w.device.type == "cpu" and w.dtype == torch.float32 and fbgemm


def pack(weight: torch.Tensor, owner) -> torch.Tensor:
    """Quantise `weight` [out, in] symmetrically per output channel (±127) and pack it for fbgemm; returns the
    handle, released when `owner` is collected."""
    w = weight.detach().float()
    scale = (w.abs().amax(1) / 127).clamp(min=1e-12).double()
    q = torch.quantize_per_channel(w, scale, torch.zeros(len(w), dtype=torch.long), 0, torch.qint8)
    key = next(_handles)
    _PACKED[key] = torch.ops.quantized.linear_prepack(q, None)
    weakref.finalize(owner, _PACKED.pop, key, None)
    return torch.tensor(key)


def mm(x, handle):
    """fbgemm's GEMM of rows already scaled to ±ACT_LEVELS (no scaling here)."""
    return torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32(x, 1.0, ACT_LEVELS + 1,
                                                                            _PACKED[int(handle)])


# A plain library op, not torch.library.custom_op: the latter's Python wrapper costs ~30 us a call (~3.5 ms a step).
_LIB = torch.library.Library("eagle3", "DEF")
_LIB.define("int8_mm(Tensor x, Tensor handle, int out_features) -> Tensor")
_LIB.impl("int8_mm", lambda x, handle, out_features: mm(x, handle), "CPU")


@torch.library.register_fake("eagle3::int8_mm")
def _(x, handle, out_features):
    """x [M, in], already scaled to ±ACT_LEVELS per row, times the packed weight: [M, out_features] fp32."""
    return x.new_empty(x.shape[0], out_features)


def linear(x: torch.Tensor, handle: torch.Tensor, out_features: int) -> torch.Tensor:
    """x @ W.T for the weight packed under `handle`, each row of x quantised with its own scale."""
    flat = x.reshape(-1, x.shape[-1])
    r = flat.abs().amax(-1, keepdim=True).clamp(min=1e-30) / ACT_LEVELS
    scaled = flat / r
    y = torch.ops.eagle3.int8_mm(scaled, handle, out_features)
    return (y * r).view(*x.shape[:-1], out_features)

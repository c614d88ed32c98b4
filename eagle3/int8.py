"""int8 linears for CPUs without native bf16 (AVX2): fbgemm's int8 GEMM, with each activation row quantised on its own.

Why: on such CPUs the engine runs fp32, and a batch-1 step streams 540 MB of fp32 weights; torch's int4 kernel has no
fast AVX2 path past a row or two. fbgemm's int8 GEMM streams a quarter of fp32's bytes: at a row or two it costs about
a third of fp32's GEMM (bench/results/linears.md), though with each row doubled (below) it grows with the rows sooner.

Why per-row scales: fbgemm's own dynamic quantisation takes one scale for the whole call, so a row's result would
depend on the rows beside it, and a verify forward's tree nodes would round differently from a plain step. Here each
row is scaled to ±ACT_LEVELS before the call (scale 1), the integer sums are exact, and the row's scale is
multiplied back: a row gets the same bits however many rows share the call.

Accuracy: the activations go in as two 7-bit digits (~14 bits a row) and the lm_head keeps a second weight digit, so
what is left is the int8 rounding of the layers' weights. Teacher-forced against fp32 on held-out prompts, top-1
choices agree ~97% (one 7-bit digit: 82%; bench/results/drift_avx2.md has the measured drift).

The GEMM is a library op over a handle (an int64 tensor naming the packed weight), so torch.compile sees an opaque call
with tensor inputs and fuses the scaling around it (eagle3/compiled.py)."""
import itertools
import weakref

import torch

# Each activation row is scaled to ±ACT_LEVELS and written as two 7-bit digits, v = DIGIT * hi + lo. fbgemm on AVX2
# sums pairs of u8 x s8 products in int16 (vpmaddubsw), so one 8-bit digit could saturate (measured: 1-3% of a real
# layer's outputs off); 7-bit digits cannot. Two digits give the row ~14 bits, so the activations cost nothing
# measurable in accuracy (one 7-bit digit agreed with fp32's top-1 choice 82% of the time, two 96.7%:
# bench/results/drift_avx2.md), for twice the rows in the GEMM: cheap at a row or two, where the kernel streams the
# weight once, but from ~8 rows on the GEMM's compute shows (batch 32 decodes slower than fp32; README).
DIGIT = 128
ACT_LEVELS = 63 * DIGIT  # hi in -63..63, lo in -64..64: both fit fbgemm's 7-bit range (zero point 64)
ZERO_POINT = 64

_PACKED = {}  # handle -> fbgemm's packed weight
_handles = itertools.count()


def supported(w: torch.Tensor) -> bool:
    """For fp32 weights on an x86 CPU (fbgemm)."""
    fbgemm = "fbgemm" in torch.backends.quantized.supported_engines
    return w.device.type == "cpu" and w.dtype == torch.float32 and fbgemm


def pack(weight: torch.Tensor, owner, digits: int = 1) -> torch.Tensor:
    """Quantise `weight` [out, in] symmetrically per output channel (±127) and pack it for fbgemm; returns the
    handle, released when `owner` is collected. digits=2 appends the rounding error's own int8 quantisation as `out`
    more rows (~15-bit weights for twice the bytes; linear() adds the two halves): for the lm_head, where int8
    weights alone flip near-tie logits."""
    w, ints, scales = weight.detach().double(), [], []
    for _ in range(digits):
        scale = (w.abs().amax(1) / 127).clamp(min=1e-12)
        q = (w / scale[:, None]).round().clamp(-127, 127)
        ints.append(q.to(torch.int8))
        scales.append(scale)
        w = w - q * scale[:, None]
    ints, scales = torch.cat(ints), torch.cat(scales)
    q = torch._make_per_channel_quantized_tensor(ints, scales, torch.zeros(len(ints), dtype=torch.long), 0)
    key = next(_handles)
    _PACKED[key] = torch.ops.quantized.linear_prepack(q, None)
    weakref.finalize(owner, _PACKED.pop, key, None)
    return torch.tensor(key)


def mm(x, handle):
    """fbgemm's GEMM of rows of integers in -64..64 (no scaling here)."""
    return torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32(x, 1.0, ZERO_POINT, _PACKED[int(handle)])


# A plain library op, not torch.library.custom_op: the latter's Python wrapper costs ~30 us a call (~3.5 ms a step).
_LIB = torch.library.Library("eagle3", "DEF")
_LIB.define("int8_mm(Tensor x, Tensor handle, int out_features) -> Tensor")
_LIB.impl("int8_mm", lambda x, handle, out_features: mm(x, handle), "CPU")


@torch.library.register_fake("eagle3::int8_mm")
def _(x, handle, out_features):
    """x [M, in], integers in -64..64, times the packed weight: [M, out_features] fp32."""
    return x.new_empty(x.shape[0], out_features)


def linear(x: torch.Tensor, handle: torch.Tensor, out_features: int, digits: int = 1) -> torch.Tensor:
    """x @ W.T for the weight packed under `handle` (with `digits`), each row of x quantised with its own scale."""
    flat = x.reshape(-1, x.shape[-1])
    # Explicit reciprocals and products, which inductor emits as written, so compiled steps give eager's bits
    r = flat.abs().amax(-1, keepdim=True).clamp(min=1e-30) * (1 / ACT_LEVELS)
    v = (flat * (1 / r)).round()
    hi = (v / DIGIT).round()
    y = torch.ops.eagle3.int8_mm(torch.cat([hi, v - DIGIT * hi]), handle, out_features * digits)  # one call
    if digits > 1:
        y = sum(y.split(out_features, 1))
    y_hi, y_lo = y.split(len(flat))
    return ((y_hi * DIGIT + y_lo) * r).view(*x.shape[:-1], out_features)

"""Building blocks shared by the target and the draft head: a fast-small-batch Linear, RMSNorm, RoPE, attention."""
import contextlib
import contextvars

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import amx, attention, int8, vnni


# Rows per dense GEMM call in "row-chunk" mode (None: off). See Linear and row_chunks().
_ROW_CHUNK = contextvars.ContextVar("row_chunk", default=None)


@contextlib.contextmanager
def row_chunks(rows):
    """Within this block, the target's Linears (`chunkable`) compute with their dense (oneDNN-packed) weight in calls
    of exactly `rows` rows, the last one padded. oneDNN picks its kernel and blocking by the call's shape, so a row's result then
    depends only on that row: the same bits whether 1 or 500 rows share the forward, which lossless verification
    needs. Worth it where dense GEMMs are much faster than the int4 kernel at many rows (AMX CPUs: bench/results/row_chunks.md)."""
    token = _ROW_CHUNK.set(rows)
    try:
        yield
    finally:
        _ROW_CHUNK.reset(token)


# On CPUs where both of the engine's int4 kernels run (AMX CPUs have AVX512-VNNI too), Linears pack their blocks for
# both, and this says which one runs: False, the AMX kernel (its cost flat from 1 to 16 rows, bound by dequantising
# the weights); True, the VNNI kernel (integer products, cheaper at a few rows, dearer at many). A module global, not
# a context variable: compiled graphs read it while tracing and dynamo guards on its value, so each kernel gets its
# own graphs. The decoder sets it per call (few_rows), so a call's plain steps and verify forwards use one kernel.
_FEW_ROWS = False


@contextlib.contextmanager
def few_rows(on=True):
    """Within this block, Linears packed for both kernels run the VNNI one (see _FEW_ROWS)."""
    global _FEW_ROWS
    old, _FEW_ROWS = _FEW_ROWS, bool(on)
    try:
        yield
    finally:
        _FEW_ROWS = old


def kernel_few_rows() -> bool:
    """Whether few_rows is on here."""
    return _FEW_ROWS


def _can_pack(w: torch.Tensor) -> bool:
    if w.device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    # oneDNN packs bf16 only where the CPU has bf16 conversions (AVX-512 BW/VL/DQ or AVX-NE-CONVERT); not on AVX2
    return w.dtype == torch.float32 or (w.dtype == torch.bfloat16 and torch.ops.mkldnn._is_mkldnn_bf16_supported())


class Linear(nn.Module):
    """nn.Linear with optional inference layouts for the CPU.

    - oneDNN-prepacked dense weight: torch's default CPU GEMM (MKL) is 3-4x slower than oneDNN for the small row
      counts (1-32) that decoding and tree verification produce (CPU-PERF-NOTES.md).
    - int4 weight-only (groups of 32, one scale and zero each, as the GGUF's Q4_1 blocks): a quarter of bf16's bytes
      to stream per step. On CPUs with AMX, the engine's own kernel (eagle3/amx.py), whose cost barely grows from 1
      to 16 rows; elsewhere torch's, which dequantises once per 4 rows. Used at every row count once set, although
      oneDNN's dense bf16 kernel is ~15% faster than torch's from ~16 rows on: the int4 kernels give each row the same
      bits however many rows share the call, and oneDNN's does not (its K=1536 down projection rounds differently at
      1 and 64 rows), which in bf16 is enough to make a speculative decode drift from a plain one. The dense weight
      is set to the same values (training, fallback).
    - int8 weights with int8 activations (fbgemm), for fp32 where no build of the VNNI kernel runs (eagle3/vnni.py
      serves CPUs with AVX2 alone too; EAGLE3_VNNI=0, no compiler): per output channel int8 weights,
      each activation row quantised on its own (eagle3/int8.py), so a row gets the same bits whatever else shares the
      call (integer sums are exact). A quarter of fp32's bytes, but each row goes in as two digits, so the GEMM is
      cheap at a row or two and compute-bound from ~8 rows (bench/results/linears.md).
    All are inference-only (no autograd through them)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None
        self._packed = None
        self._int4 = None  # (packed weight, scales_and_zeros, group size)
        self._amx = None  # (packed weight, fp16 scales) for the AMX kernel (eagle3/amx.py): Q4_1 layers, Q8_0 lm_head
        self._vnni = None  # (packed weight, fp16 scales, digits, build) for the VNNI kernel or its AVX2 build
        # (eagle3/vnni.py): Q4_1 layers, Q8_0 lm_head
        self._int8 = None  # handle of fbgemm's packed int8 weight (eagle3/int8.py)
        self._int8_digits = 1
        self.chunkable = False  # follows layers.row_chunks (the target's linears)
        self.fixed_chunk = None  # rows per call outside row_chunks too (the target's dense lm_head)

    def pack(self):
        self._packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), None) if _can_pack(self.weight) else None

    def unpack(self):
        self._packed = None

    def set_int4(self, q, scale, zero, group=32):
        """Weight := (q - 8) * scale + zero per group of `group` inputs; q [out, in] in 0..15, scale/zero [out, in/group].
        Also rewrites the dense weight (and its packed copy) to those values."""
        dev, dt = self.weight.device, self.weight.dtype
        minimum = zero.float() - 8 * scale.float()  # the Q4_1 block's m (exact for the GGUF's fp16 d and m)
        if self._amx_runs(q.shape, group):
            self._amx, self._int4 = tuple(t.to(dev) for t in amx.pack_q4(q, scale, minimum)), None
            if self._vnni_runs(q.shape, group):  # for calls of few rows (_FEW_ROWS)
                self._vnni = (*(t.to(dev) for t in vnni.pack_q4(q, scale, minimum)), vnni.digits(), vnni.kind())
            self._set_dense(amx.dense(q, scale, minimum, dt))
            return
        if self._vnni_runs(q.shape, group):
            packed = tuple(t.to(dev) for t in vnni.pack_q4(q, scale, minimum))
            self._vnni, self._int4 = (*packed, vnni.digits(), vnni.kind()), None
            self._set_dense(amx.dense(q, scale, minimum, dt))
            return
        scale, zero = scale.to(dt).float(), zero.to(dt).float()  # rounded as the kernel stores them
        dense = (q.float() - 8).view(q.shape[0], -1, group) * scale[..., None] + zero[..., None]
        if int4_supported(self.weight):
            packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32).contiguous(), 1)
            sz = torch.stack([scale, zero], -1).transpose(0, 1).contiguous().to(dt)  # [in/group, out, 2]
            self._int4, self._amx = (packed.to(dev), sz.to(dev), group), None
        self._set_dense(dense.view(q.shape).to(dt))

    def set_q8(self, q, d) -> bool:
        """Weight := q * d per block of 32 inputs (the GGUF's Q8_0: q [out, in] int8, d [out, in/32]) through the AMX
        or VNNI kernel, where one runs; returns whether it does (elsewhere the dense weight stays as it is). The dense
        weight is rewritten to the same values, and calls need no fixed row chunk: the kernels' rows are invariant."""
        dev = self.weight.device
        amx_runs, vnni_runs = self._amx_runs(q.shape, 32), self._vnni_runs(q.shape, 32)
        if not (amx_runs or vnni_runs):
            return False
        if amx_runs:
            self._amx = tuple(t.to(dev) for t in amx.pack_q8(q, d))
        if vnni_runs:  # on AMX CPUs too, for calls of few rows (_FEW_ROWS)
            self._vnni = (*(t.to(dev) for t in vnni.pack_q8(q, d)), vnni.digits(), vnni.kind())
        self._set_dense(amx.dense(q, d, dtype=self.weight.dtype))
        self.fixed_chunk = None
        return True

    def own_kernel_takes(self, group=32) -> bool:
        """Whether set_int4 with groups of `group` would run one of the engine's own kernels (AMX, VNNI) here."""
        return self._amx_runs(self.weight.shape, group) or self._vnni_runs(self.weight.shape, group)

    def _vnni_runs(self, shape, group) -> bool:
        """Whether the VNNI kernel takes this Linear's blocks: bf16 or fp32 on a CPU where it runs (set_int4 and set_q8
        ask AMX's first)."""
        return vnni.takes(self.weight) and vnni.fits(*shape, group)

    def _amx_runs(self, shape, group) -> bool:
        """Whether the AMX kernel takes this Linear's blocks: bf16 on a CPU where it runs, whole 64-column sets."""
        return int4_supported(self.weight) and amx.available() and amx.fits(*shape, group)

    def _set_dense(self, w):
        """The dense weight := w (training, fallback paths), and its oneDNN-packed copy where there is one."""
        self.weight.data = w.to(self.weight.device)
        if self._packed is not None:
            self.pack()

    def set_int8(self, digits=1):
        """An int8 copy of the dense weight for fbgemm (eagle3/int8.py), with `digits` int8 digits, used from now on.
        Its rows are invariant, so no fixed row chunk (which would route calls to the dense weight) is needed."""
        self._int8, self._int8_digits = int8.pack(self.weight, self, digits), digits
        self.fixed_chunk = None

    def forward(self, x):
        if torch.is_grad_enabled():
            return F.linear(x, self.weight, self.bias)
        x = x.to(self.weight.dtype)  # the residual stream may be wider than the weights (fp32 vs bf16 on a CPU)
        if self._amx is not None and not (_FEW_ROWS and self._vnni is not None):  # row-invariant: no row chunks
            y = amx.mm(x, *self._amx)
            return y if self.bias is None else y + self.bias
        if self._vnni is not None:  # row-invariant too
            y = vnni.mm(x, *self._vnni)
            return y if self.bias is None else y + self.bias
        chunk = None
        if not torch.compiler.is_compiling():  # compiled steps (eagle3/compiled.py) run only where chunks are off
            chunk = (_ROW_CHUNK.get() if self.chunkable else None) or self.fixed_chunk
        if chunk and self._packed is not None:
            return self._chunked(x, chunk)
        if self._int4 is not None:
            packed, sz, group = self._int4
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(x.reshape(-1, x.shape[-1]), packed, group, sz)
            y = y.view(*x.shape[:-1], -1)
            return y if self.bias is None else y + self.bias
        if self._int8 is not None:
            y = int8.linear(x, self._int8, self.weight.shape[0], self._int8_digits)
            return y if self.bias is None else y + self.bias
        if self._packed is not None and not torch.compiler.is_compiling():  # opaque to the compiler
            return torch.ops.mkldnn._linear_pointwise(x, self._packed, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)

    @torch.no_grad()
    def row_invariant(self, rows=(1, 2, 3, 4, 5, 8, 9, 16, 17, 31, 33), seed=0) -> bool:
        """Whether this Linear gives a row the same bits whatever the call's row count: a probe on random inputs,
        each count's rows against the same rows inside one 64-row call. oneDNN picks its kernel by shape, and on
        some CPUs (AMX) its 1-row kernel rounds differently from its many-row one; elsewhere every count agrees."""
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(64, self.weight.shape[1], generator=g).to(self.weight)
        full = self(x)
        return all(torch.equal(self(x[:n].clone()), full[:n]) for n in rows)

    def _chunked(self, x, rows):
        flat = x.reshape(-1, x.shape[-1])
        pad = -len(flat) % rows
        if pad:
            flat = torch.cat([flat, flat.new_zeros(pad, flat.shape[1])])
        y = torch.cat([torch.ops.mkldnn._linear_pointwise(c, self._packed, self.bias, "none", [], "")
                       for c in flat.split(rows)])
        return y[: len(y) - pad].view(*x.shape[:-1], -1)


def has_int4(model) -> bool:
    """Whether any Linear of the model runs an int4 kernel (torch's, the AMX or the VNNI one)."""
    return any(isinstance(m, Linear) and (m._int4 is not None or m._vnni is not None and vnni.is_q4(m._vnni[0])
                                          or m._amx is not None and amx.is_q4(*m._amx))
               for m in model.modules())


def has_amx(model) -> bool:
    """Whether any Linear of the model runs the AMX kernel (eagle3/amx.py)."""
    return any(isinstance(m, Linear) and m._amx is not None for m in model.modules())


def has_both_kernels(model) -> bool:
    """Whether some Linear of the model is packed for the AMX and the VNNI kernel (layers.few_rows picks)."""
    return any(isinstance(m, Linear) and m._amx is not None and m._vnni is not None for m in model.modules())


def own_kernel(model) -> bool:
    """Whether any Linear of the model runs one of the engine's own kernels (eagle3/amx.py, eagle3/vnni.py)."""
    return any(isinstance(m, Linear) and (m._amx is not None or m._vnni is not None) for m in model.modules())


def has_int8(model) -> bool:
    """Whether any Linear of the model runs fbgemm's int8 kernel."""
    return any(isinstance(m, Linear) and m._int8 is not None for m in model.modules())


def quantises(model) -> bool:
    """Whether the model's linears quantise their activations (fbgemm's int8, the VNNI kernel): cache_dtype's
    `quantized`."""
    return has_int8(model) or any(isinstance(m, Linear) and m._vnni is not None for m in model.modules())


def weight_format(model) -> str:
    """'int4 (AMX kernel)', 'int4 (VNNI kernel)', 'int4', 'int8' or the dense weights' dtype: what a profile or a
    report should name."""
    if has_amx(model):
        return "int4 (AMX kernel)"
    vnni_runs = {m._vnni[2:] for m in model.modules() if isinstance(m, Linear) and m._vnni is not None}
    if vnni_runs:
        digits, build = min(vnni_runs)
        return f"int4 ({vnni.label(build)})" if digits == 2 else f"int4 ({vnni.label(build)}, {digits}-digit activations)"
    if has_int4(model):
        return "int4"
    return "int8" if has_int8(model) else str(model.embed_tokens.weight.dtype).removeprefix("torch.")


def int4_supported(w: torch.Tensor) -> bool:
    """The CPU int4 kernel has a fast path only for bf16 activations (fp32 ones are 10-100x slower)."""
    return w.device.type == "cpu" and w.dtype == torch.bfloat16


def pack_linears(module, on=True):
    """Prepack (or unpack) every Linear under `module` for fast small-batch CPU inference; no-op elsewhere."""
    for m in module.modules():
        if isinstance(m, Linear):
            m.pack() if on else m.unpack()
    return module


def int8_linears(module, lm_head_digits=1):
    """Give every Linear under `module` fbgemm int8 weights (eagle3/int8.py): the target's layers and lm_head, or a
    draft head's linears (its fp32 weights, 39 MB for SmolLM2's, would cost a third of an int8 target step per draft
    step). lm_head_digits=2: the module's lm_head keeps ~15-bit weights (a target's greedy choices hang on it)."""
    for m in module.modules():
        if isinstance(m, Linear):
            m.set_int8(lm_head_digits if m is getattr(module, "lm_head", None) else 1)
    return module


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)


class Rope(nn.Module):
    """Rotary embedding (HF "rotate_half" convention) with a precomputed cos/sin table indexed by position. The table
    stays float32 when the model is cast to bf16: bf16 angles would be off by up to ~1e-2."""

    def __init__(self, head_dim: int, theta: float, max_positions: int):
        super().__init__()
        self.head_dim, self.theta, self.max_positions = head_dim, theta, max_positions
        self._build(torch.device("cpu"))  # a real table even when the model is built on the meta device

    def _build(self, device):
        f64 = dict(dtype=torch.float64, device=device)
        inv = 1.0 / (self.theta ** (torch.arange(0, self.head_dim, 2, **f64) / self.head_dim))
        freqs = torch.outer(torch.arange(self.max_positions, **f64), inv)
        emb = torch.cat([freqs, freqs], -1)
        self.register_buffer("cos", emb.cos().float(), persistent=False)
        self.register_buffer("sin", emb.sin().float(), persistent=False)

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)  # moves the table (and may cast it) ...
        self._build(self.cos.device)  # ... which is then rebuilt in float32 where it now lives
        return self

    def forward(self, q, k, positions):
        """q, k: [B, H, T, D]; positions: [B, T]."""
        cos, sin = self.table(positions, q.dtype)
        return rotate(q, cos, sin), rotate(k, cos, sin)

    def table(self, positions, dtype):
        """cos, sin [B, 1, T, D] for positions [B, T]: looked up once per forward, shared by all layers."""
        return self.cos[positions].unsqueeze(1).to(dtype), self.sin[positions].unsqueeze(1).to(dtype)


def rotate(x, cos, sin):
    return x * cos + _rotate_half(x) * sin


def _rotate_half(x):
    a, b = x.chunk(2, -1)
    return torch.cat([-b, a], -1)


class MLP(nn.Module):
    """SwiGLU. fused: gate and up projections in one matmul (gate_up), one GEMM call instead of two on the hot path;
    the draft head keeps them apart, as the EAGLE-3 checkpoint layout has them."""

    def __init__(self, hidden: int, inter: int, fused: bool = False):
        super().__init__()
        if fused:
            self.gate_up = Linear(hidden, 2 * inter)
        else:
            self.gate_proj = Linear(hidden, inter)
            self.up_proj = Linear(hidden, inter)
        self.down_proj = Linear(inter, hidden)

    def forward(self, x):
        if hasattr(self, "gate_up"):
            gate, up = self.gate_up(x).chunk(2, -1)
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        return self.down_proj(F.silu(gate) * up)


class KVCache:
    """Preallocated K/V for all layers: [layers, batch, kv_heads, max_len, head_dim], plus each row's committed length.

    New tokens are written at slots lens[b] + 0..T-1; `lens` only advances on commit, so rejected tree tokens are
    simply overwritten by the next forward."""

    def __init__(self, layers, batch, kv_heads, max_len, head_dim, dtype, device):
        shape = (layers, batch, kv_heads, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.lens = torch.zeros(batch, dtype=torch.long, device=device)

    @property
    def max_len(self):
        return self.k.shape[3]

    @property
    def dtype(self):
        return self.k.dtype

    def slots(self, offset, T):
        """Where T new tokens go: slots lens[b] + offset + 0..T-1. A plain slice when every row starts at the same
        slot (always at batch 1): a strided copy instead of an index_put per layer."""
        start = self.lens[0]
        if bool((self.lens == start).all()):
            start = int(start) + offset
            return slice(start, start + T)
        return self.lens[:, None] + offset + torch.arange(T, device=self.lens.device)[None]

    def write(self, layer, k, v, slots):
        """k, v: [B, H, T, D]; slots: from slots()."""
        self.write_all(k[None], v[None], slots, layer)

    def write_all(self, k, v, slots, first=0):
        """k, v: [n, B, H, T, D], the new keys and values of layers first..first+n-1 at once; slots: from slots()."""
        n = k.shape[0]
        if isinstance(slots, slice):
            self.k[first: first + n, :, :, slots] = k
            self.v[first: first + n, :, :, slots] = v
            return
        b = torch.arange(k.shape[1], device=k.device)[:, None]
        # advanced indices on dims 1 and 3 put their [B, T] first: [B, T, n, H, D]
        self.k[first: first + n, b, :, slots] = k.permute(1, 3, 0, 2, 4)
        self.v[first: first + n, b, :, slots] = v.permute(1, 3, 0, 2, 4)

    def view(self, layer, length):
        return self.k[layer, :, :, :length], self.v[layer, :, :, :length]

    def commit(self, src, counts):
        """Move the tokens at relative slots src[b, :counts[b]] (relative to lens[b]) to lens[b] + 0..counts[b]-1 in
        every layer, then advance lens. Entries past counts[b] in src may hold any valid index."""
        base = self.lens[:, None]
        dst = base + torch.arange(src.shape[1], device=src.device)[None]
        src_abs = base + src
        b = torch.arange(src.shape[0], device=src.device)[:, None]
        for cache in (self.k, self.v):
            cache[:, b, :, dst] = cache[:, b, :, src_abs]
        self.lens += counts

    def extend(self, other):
        """Append other's rows (same layers, heads and max_len) after this cache's: prompts joining a running
        batch. Returns self."""
        self.k, self.v = torch.cat([self.k, other.k], 1), torch.cat([self.v, other.v], 1)
        self.lens = torch.cat([self.lens, other.lens])
        return self

    def keep(self, rows):
        """Keep these rows, in this order: row j becomes old row rows[j]. In place when every rows[j] >= j (in
        ascending order, or what Rows.retire returns): a copy of the whole cache per finished row costs ~0.1 s at
        batch 32, moving the few rows that change place almost nothing."""
        order = list(rows)  # a list of ints: the checks below run in Python, with no device sync
        idx = torch.as_tensor(order, dtype=torch.long, device=self.lens.device)
        if any(r < j for j, r in enumerate(order)):  # a row would be read after being overwritten
            self.k, self.v, self.lens = self.k[:, idx], self.v[:, idx], self.lens[idx]
            return
        for j, r in enumerate(order):
            if r != j:
                self.k[:, j].copy_(self.k[:, r])
                self.v[:, j].copy_(self.v[:, r])
        n = len(order)
        self.k, self.v, self.lens = self.k[:, :n], self.v[:, :n], self.lens[idx]


def stream_dtype(weight: torch.Tensor):
    """The residual stream's and norms' dtype: fp32 on a CPU with bf16 weights (bf16 norms are slower there, and fp32
    keeps the sum of 30 layers closer to the reference), the weights' own dtype elsewhere."""
    return torch.float32 if weight.device.type == "cpu" and weight.dtype == torch.bfloat16 else weight.dtype


def cache_dtype(weight: torch.Tensor, head_dim: int, quantized=False):
    """K/V and attention dtype for a model whose weights are `weight`'s, with heads of `head_dim` (`quantized`: its
    linears quantise their activations, eagle3/int8.py).

    With bf16 weights on a CPU, or quantised activations, attention must give a token the same bits whether it is
    decoded alone or verified among 16 tree nodes (every other op of a forward does: the linears and norms are
    row-invariant there), or bf16 roundings downstream would flip and speculative output drift from plain decoding.
    SDPA sums in an order that depends on the query and key counts, so: fp32 through eagle3/attention.py's kernel,
    which visits each query's keys in one order, where it builds and has the head dim; else float64 SDPA, whose
    ~1e-16 differences never reach a bf16 rounding. Elsewhere the weights' own dtype."""
    if weight.device.type != "cpu":
        return weight.dtype
    kernel = attention.available() and head_dim in attention.HEAD_DIMS  # fp32 weights' attention runs it too
    if weight.dtype == torch.bfloat16 or quantized:
        return torch.float32 if kernel else torch.float64
    return weight.dtype


def attention_mask(lens, tree_mask, total_len):
    """Boolean mask [B, 1, T, total_len] for T new queries whose keys sit in a block of W = tree_mask.shape[2]
    slots starting at lens[b]: query i of row b sees the committed prefix (< lens[b]) and the block slots j for
    which tree_mask[b, i, j] is true."""
    B, T, W = tree_mask.shape
    rel = torch.arange(total_len, device=lens.device)[None, :] - lens[:, None]  # [B, S] slot relative to the block
    in_block = (rel >= 0) & (rel < W)
    block = tree_mask.gather(2, rel.clamp(0, W - 1)[:, None, :].expand(B, T, total_len)) & in_block[:, None, :]
    return ((rel < 0)[:, None, :] | block).unsqueeze(1)


def attend(q, k, v, mask, k2=None, v2=None):
    """q [B, Hq, T, D], k/v [B, Hkv, S, D] (grouped-query attention), mask [B, 1, T, S + S2] bool; k2/v2 [B, Hkv,
    S2, D]: keys after k/v's (a compiled step's new keys after the cache's).

    fp32 on a CPU: eagle3/attention.py's kernel (row-invariant, reads k2/v2 in place). Else SDPA, with the query heads
    that share a K/V head folded into one query block, [B, Hkv, Hq/Hkv * T, D]: each K/V head is then read once for
    all its query heads (SDPA's enable_gqa reads it once per query head), 20-25% less attention time at batch 8-32 on
    a CPU."""
    B, Hq, T, D = q.shape
    if attention.runs(q):
        return attention.attend(q, k, v, mask, k2, v2)
    if k2 is not None:
        k, v = torch.cat([k, k2], 2), torch.cat([v, v2], 2)
    g = Hq // k.shape[1]
    if g == 1:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    q = q.reshape(B, k.shape[1], g * T, D)
    mask = mask[:, :, None].expand(B, 1, g, T, mask.shape[-1]).reshape(B, 1, g * T, mask.shape[-1])
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask).view(B, Hq, T, D)

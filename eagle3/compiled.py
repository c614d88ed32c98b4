"""Compiled decode steps: the layer stack of a decode or verify forward in a few torch.compile (inductor) calls, as
gpt-fast compiles its decode step, so a step stops paying for ~1,000 small eager ops and their Python calls.

The layers run in groups of equal size (group_size: SmolLM2's 30 layers as 3 calls of 10); the groups share one graph
(same code, their weights are graph inputs). A group reads the KV cache and never writes it: each layer attends over
cat(cache[:S], its new keys), S being the longest committed row, and the group's new K/V come back stacked, written
into the cache with one copy per group (KVCache.write_all). So no graph mutates a buffer that grows, and the shapes
are the new tokens' [B, T] and S. T is padded up to a bucket, a power of two (1, 2, 4, 8, 16: a plain step and the
default trees, which warm() compiles ahead; larger trees compile 32, 64, ... at first use); the batch dimension (from
2 rows on) and S are dynamic, so one graph per bucket serves every context length and batch size (batch 1 and S = 1
are specialised by dynamo and get their own).

Every decode and verify forward of a call runs compiled, whatever its size: an eager forward gives other bits
(inductor fuses the norms and residual adds), so a tree verified eagerly among compiled plain steps can accept what
they would not emit. Before 2026-12-07 trees past 16 nodes ran eager: the hybrid drafter's grafted trees (up to 21
nodes) and total_tokens=24 decoded only 21 and 16 of 40 free-form prompts (default target, bf16, batch 1) exactly as
vanilla did. Prefills stay eager, so a prompt's bits do not depend on the prompts it was padded with. Lossless stays
defined as before: in compiled steps too, a row's bits do not depend on how many rows or tree nodes share a forward (tests/test_eagle3_compiled.py), so verification accepts exactly what plain steps emit,
and a prompt decodes alike at any batch size. (Keys that sit in other places than in an eager forward change
float64 attention's summation order by ~1e-16, which never reaches a bf16 rounding: layers.cache_dtype.)

Off with EAGLE3_COMPILE=0. On by default where the target's linears are the int4 kernel (CPUs with bf16), fbgemm's
int8 one (eagle3/int8.py, an opaque library op) or on CUDA: the fp32 CPU path's oneDNN-packed weights are opaque to
the compiler, which would fall back to plain (slower) GEMMs.
Calls that use row chunks (layers.row_chunks, AMX CPUs from 16 rows) stay eager.

Measured on a 2-core AVX-512 BF16 VM (no AMX), SmolLM2-135M int4, batch 1, one new token at a context of 60-210,
150 steps: 12.5-13.5 ms a forward (median) in groups of 6, the same within noise as one graph of all 30 layers
(12.6-13.7), 17.4 eager. Compiling a bucket's graph: ~10 s in groups of 6 once inductor's kernels are built (~25 s
the first time), 47 s for the 30-layer graph; from inductor's on-disk cache, seconds. An earlier design compiled
each layer's pieces around an eager attention (31 calls a step): 14.8-15.3 ms where one graph took 10.7-11.1 (AMX
Xeon)."""
import contextlib
import contextvars
import os
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

import torch

from .layers import attend, has_int4, has_int8

BUCKETS = (1, 2, 4, 8, 16)  # new tokens per forward that warm() compiles ahead: a plain step and the default trees

_ON = contextvars.ContextVar("compiled_steps", default=False)


def layers(blocks, x, rope, k, v, mask):
    """A group of consecutive layers over x [B, T, hidden], given their committed cache k/v [n, B, Hkv, S, D] (read
    only) and block_mask's mask: the group's output, each layer's input (the EAGLE-3 features are three of them) and
    the new keys and values of every layer, [n, B, Hkv, T, D] each."""
    inputs, new_k, new_v = [], [], []
    for i, block in enumerate(blocks):
        inputs.append(x)
        q, kk, vv = block.begin(x, rope)
        x = block.finish(x, attend(q, k[i], v[i], mask, kk, vv))
        new_k.append(kk)
        new_v.append(vv)
    return x, inputs, torch.stack(new_k), torch.stack(new_v)


def group_size(n_layers, most=10):
    """Layers per compiled call: the largest divisor of the layer count up to `most`, so every group has the same
    shape and all share one graph (SmolLM2's 30 layers: 3 calls of 10). Each call pays dynamo's guard checks and
    wrappers (~0.2 ms on a 2-core Zen 3 EPYC), while a graph compiles in time that grows with its layers: 3 calls of 10
    measured 0.94x the time of 5 calls of 6 per batch-1 forward (median of 16 alternated blocks of 30 forwards in one
    process, C++ wrapper, 2026-12-07) and compile ~1.7x longer; a graph of the whole stack compiled ~5x longer (47 s
    vs ~10 s a bucket on 2 cores)."""
    return max(d for d in range(1, most + 1) if n_layers % d == 0)


def block_mask(lens, tree_mask, S):
    """[B, 1, T, S + T]: query i of row b sees the committed slots < lens[b] of the cache's first S, and the new
    tokens (placed after them) that tree_mask[b, i] allows."""
    committed = torch.arange(S, device=lens.device)[None, :] < lens[:, None]  # [B, S]
    committed = committed[:, None, :].expand(-1, tree_mask.shape[1], -1)
    return torch.cat([committed, tree_mask], 2).unsqueeze(1)


def run(steps, model, x, rope, cache, tree_mask):
    """The compiled groups over the cache's first S = max(lens) slots, then each group's new K/V written at
    lens[b] + 0..T-1: the same cache state and outputs (x, features) as the eager loop (target.LlamaModel._layers)."""
    S, T = int(cache.lens.max()), x.shape[1]
    slots = cache.slots(0, T)
    mask = block_mask(cache.lens, tree_mask, S)
    g, inputs = group_size(len(model.layers)), []
    for start in range(0, len(model.layers), g):
        k, v = cache.k[start: start + g, :, :, :S], cache.v[start: start + g, :, :, :S]
        _mark_dynamic((x, (0,)), (rope[0], (0,)), (rope[1], (0,)), (mask, (0, 3)), (k, (1, 3)), (v, (1, 3)))
        x, seen, new_k, new_v = steps.layers(tuple(model.layers[start: start + g]), x, rope, k, v, mask)
        cache.write_all(new_k, new_v, slots, start)
        inputs += seen
    return x, torch.cat([inputs[i] for i in model.config.feature_layers], -1)


def _mark_dynamic(*tensor_dims):
    """(tensor, dims) pairs: those sizes marked dynamic, so one graph serves them all (dynamo specialises sizes 0 and
    1 itself, so batch 1 has its own)."""
    for t, dims in tensor_dims:
        for d in dims:
            if t.shape[d] > 1:
                torch._dynamo.maybe_mark_dynamic(t, d)


@dataclass(frozen=True)
class Steps:
    layers: Callable | None  # the compiled group of layers (None: the eager loop)
    tokens: int | None  # the bucket new tokens are padded to (None: no padding)


EAGER = Steps(None, None)


def available(model) -> bool:
    """Whether compiled steps may run for this target: not switched off, and linears the compiler can trace."""
    if os.environ.get("EAGLE3_COMPILE", "1").lower() in ("0", "false", "no", "off"):
        return False
    if model.embed_tokens.weight.device.type == "cuda" or has_int4(model):
        return True
    # fbgemm int8 steps compiled with inductor's AVX-512 code corrupted the heap on the default target (2-core
    # AVX512-BF16 EPYC, 2026-12-07: "malloc(): unaligned tcache chunk"; fine with ATEN_CPU_CAPABILITY=avx2 and eager)
    return has_int8(model) and torch.backends.cpu.get_cpu_capability() in ("DEFAULT", "AVX2")


@contextlib.contextmanager
def compiled_steps(on=True):
    """Within this block, target forwards other than prefills run the compiled layer stack."""
    token = _ON.set(bool(on))
    try:
        yield
    finally:
        _ON.reset(token)


def bucket(tokens) -> int:
    """The new tokens per row a forward of `tokens` really computes with compiled steps: the next power of two."""
    return 1 << (tokens - 1).bit_length()


def steps(shape) -> Steps:
    """How a forward of tokens `shape` [B, T] runs: compiled, padded to its bucket, within compiled_steps()."""
    return Steps(_layers(), bucket(shape[1])) if _ON.get() else EAGER


@lru_cache(maxsize=1)
def _layers():
    # graphs per bucket (up to 128 nodes) x (batch 1, 2+, a view's row stride) x kind of target (dtype, weight
    # format, sizes) in this process
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 128)
    # Dynamo checks guards on every module attribute and weight a graph reads before each call: 1.5 ms a step for
    # SmolLM2 (~10%). With dict tags it skips the modules whose attributes have not changed since it last saw them:
    # 0.9 ms (measured on the EPYC of the docstring, 50 steps under torch.profiler; batch-1 step medians over 3
    # alternated runs of 150 steps: 12.8-14.3 ms with, 13.7-14.9 without).
    torch._dynamo.config.use_recursive_dict_tags_for_guards = True
    return torch.compile(layers, dynamic=False, fullgraph=True, options=_options())


def _options():
    """inductor's options: on CPUs a C++ wrapper around the graph's kernels (EAGLE3_CPP_WRAPPER=0: the Python one).
    The Python wrapper's per-kernel calls, size asserts and buffer bookkeeping cost ~1.1 ms of a ~12 ms batch-1
    forward of the default target (torch.profiler, 2-core AVX2-only Zen 3 EPYC, AVX2 kernel); alternated blocks of
    30 forwards in one process measured 0.83-0.90x the Python wrapper's time (scratch, 2026-12-07). It compiles ~1.4x
    longer (tests/test_eagle3_compiled.py from a cold cache: 445 s against 326), once: inductor's on-disk cache keeps
    it."""
    on = os.environ.get("EAGLE3_CPP_WRAPPER", "1").lower() not in ("0", "false", "no", "off")
    return {"cpp_wrapper": on and not torch.cuda.is_available()}


def head_step(head, emb, hidden, positions, k, v, mask):
    """A draft head's step (draft.Eagle3Head.step) over its cache k/v [B, Hkv, max_len, D] (read only): compiled within
    compiled_steps(), eager elsewhere. Unlike the target's, its graph is dynamic in the new tokens too, with no
    padding: a draft only proposes, so its bits need not match any other forward's, and one graph then serves every
    tree width, accept length and catch-up (dynamo gives sizes 1 their own). The ~60 eager ops of a step cost
    ~0.8 ms on a 2-core EPYC, three times a tree round (two levels of drafting and the observe)."""
    if not _ON.get():
        return head.step(emb, hidden, positions, k, v, mask)
    _mark_dynamic((emb, (0, 1)), (hidden, (0, 1)), (positions, (0, 1)), (k, (0, 2)), (v, (0, 2)), (mask, (0, 2, 3)))
    return _head()(head, emb, hidden, positions, k, v, mask)


def _step_of(head, *inputs):
    return head.step(*inputs)


@lru_cache(maxsize=1)
def _head():
    _layers()  # the same dynamo settings
    return torch.compile(_step_of, dynamic=False, fullgraph=True, options=_options())


@torch.no_grad()
def warm(model, rows, largest=BUCKETS[-1]):
    """Compile (or load from inductor's on-disk cache) the graphs of BUCKETS and up to `largest` nodes for forwards
    of `rows` rows now. Left to first use, a bucket's compile (seconds) lands inside whichever call first drafts a
    tree of that size: in a bench.peers run two of three batch-8 EAGLE-3 repetitions ran at half of vanilla's speed
    for it."""
    dev = model.embed_tokens.weight.device
    buckets = sorted(set(BUCKETS) | {bucket(n) for n in range(1, largest + 1)})
    cache = model.new_cache(rows + 1, 4 + buckets[-1])
    cache.lens[:] = 4  # a short committed context (forwards never advance it); its length is a dynamic size
    for n in (rows + 1, rows):
        if n == rows:  # a finished row leaves the cache a view with another row stride (KVCache.keep): own graphs
            cache.keep(list(range(rows)))
        for T in buckets:
            toks = torch.zeros(n, T, dtype=torch.long, device=dev)
            pos = (4 + torch.arange(T, device=dev)).expand(n, T)
            mask = torch.ones(T, T, dtype=torch.bool, device=dev).tril().expand(n, T, T)
            with compiled_steps(True):
                model(toks, pos, cache, mask)


def pad(tokens, positions, tree_mask, T):
    """Pad a forward's new tokens [B, t] to T: extra tokens repeat the last one and see only themselves, so the
    real tokens never see them; their outputs are dropped."""
    B, t = tokens.shape
    if t == T:
        return tokens, positions, tree_mask
    extra = T - t
    tokens = torch.cat([tokens, tokens[:, -1:].expand(B, extra)], 1)
    positions = torch.cat([positions, positions[:, -1:].expand(B, extra)], 1)
    mask = torch.zeros(B, T, T, dtype=torch.bool, device=tree_mask.device)
    mask[:, :t, :t] = tree_mask
    mask[:, t:, t:] = torch.eye(extra, dtype=torch.bool, device=tree_mask.device)
    return tokens, positions, mask

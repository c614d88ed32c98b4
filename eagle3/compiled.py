"""Compiled decode steps: torch.compile (inductor) over the pure tensor work between two attentions, as gpt-fast
compiles its decode step, so a step stops paying for ~1,000 small eager ops.

A layer is begin (norm, q/k/v, rope) -> attention over the cache -> finish (o_proj, residual, MLP, residual)
(target.Block). Attention stays eager: its shapes grow with the context, and the compiled pieces then depend only on
the new tokens' shape [B, T]. T is padded up to a bucket (1, 2, 4, 8, 16: a plain step and the verify trees); the
batch dimension is dynamic from 2 rows on (rows retire one by one), and batch 1 has its own graphs. The 30 layers
share the graphs (same code, their weights are graph inputs). Compiling takes a few seconds per graph, once per
process, with inductor's on-disk cache making later processes faster.

Decode and verify forwards run compiled; prefills stay eager, so a prompt's bits do not depend on the prompts it was
padded with. Lossless stays defined as before: in compiled steps too, a row's bits do not depend on how many rows or
tree nodes share a forward (tests/test_eagle3_compiled.py), so verification accepts exactly what plain steps emit,
and a prompt decodes alike at any batch size.

Off with EAGLE3_COMPILE=0. On by default where the target's linears are the int4 kernel (CPUs with bf16) or on CUDA:
the fp32 CPU path's oneDNN-packed weights are opaque to the compiler, which would fall back to plain (slower) GEMMs.
Calls that use row chunks (layers.row_chunks, AMX CPUs from 16 rows) stay eager.

Measured on a 2-core AVX-512 EPYC (no AMX), SmolLM2-135M int4, one new token at a context of 120: 14.0-15.0 ms a
forward compiled against 16.0-17.5 eager; at 4-16 new tokens, or 3-8 rows, the int4 kernel dominates and compiled
steps save 1-2 ms. Dynamo's guard checks (~40 us a call, 31 calls a step) are most of what is left of the overhead."""
import contextlib
import contextvars
import os
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

import torch

from .layers import has_int4

BUCKETS = (1, 2, 4, 8, 16)  # new tokens per forward that compiled steps serve, padded up

_ON = contextvars.ContextVar("compiled_steps", default=False)


def begin(block, x, rope):
    return block.begin(x, rope)


def finish(block, x, a):
    return block.finish(x, a)


def finish_begin(block, following, x, a, rope):
    """One layer's finish and the next layer's begin: the stretch between two attentions, one call."""
    x = block.finish(x, a)
    return x, following.begin(x, rope)


@dataclass(frozen=True)
class Steps:
    begin: Callable
    finish: Callable
    finish_begin: Callable
    tokens: int | None  # the bucket new tokens are padded to (None: no padding)


EAGER = Steps(begin, finish, finish_begin, None)


def available(model) -> bool:
    """Whether compiled steps may run for this target: not switched off, and linears the compiler can trace."""
    if os.environ.get("EAGLE3_COMPILE", "1").lower() in ("0", "false", "no", "off"):
        return False
    return model.embed_tokens.weight.device.type == "cuda" or has_int4(model)


@contextlib.contextmanager
def compiled_steps(on=True):
    """Within this block, target forwards of up to BUCKETS[-1] new tokens run the compiled pieces."""
    token = _ON.set(bool(on))
    try:
        yield
    finally:
        _ON.reset(token)


def bucket(tokens) -> int:
    """The new tokens per row a forward of `tokens` really computes with compiled steps (past the largest bucket:
    eager, unpadded)."""
    return next((b for b in BUCKETS if b >= tokens), tokens)


def steps(shape) -> Steps:
    """The pieces a forward of tokens `shape` [B, T] runs: compiled (with its bucket) for up to BUCKETS[-1] tokens
    per row, else eager."""
    if not _ON.get() or shape[1] > BUCKETS[-1]:
        return EAGER
    return _compiled(bucket(shape[1]))


@lru_cache(maxsize=None)
def _compiled(bucket) -> Steps:
    return Steps(*_functions(), bucket)


@lru_cache(maxsize=1)
def _functions():
    # one graph per bucket, function and kind of target (dtype, sizes) in this process
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 8 * len(BUCKETS))
    return tuple(_batch_dynamic(torch.compile(f, dynamic=False, fullgraph=True)) for f in (begin, finish, finish_begin))


def _batch_dynamic(fn):
    """fn with every tensor argument's batch dimension marked dynamic from 2 rows on: one graph serves every batch
    size >= 2 (dynamo specialises size 1, which gets its own)."""
    def call(*args):
        for a in args:
            for t in a if isinstance(a, tuple) else (a,):
                if isinstance(t, torch.Tensor) and t.shape[0] > 1:
                    torch._dynamo.mark_dynamic(t, 0)
        return fn(*args)
    return call


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

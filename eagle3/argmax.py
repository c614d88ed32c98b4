"""Greedy picks over bf16 logits on a CPU with an own kernel (kernels/argmax.cpp): the same index as
logits.float().argmax(-1), without writing the logits out in fp32 first.

Why: verify.greedy converts bf16 logits to fp32 because bf16's CPU argmax is 3-4x slower, but at a verify of 16 nodes
per row at batch 8 that conversion and argmax over 8 x 16 x 49,152 logits took 5.9 ms on the 2-core AMX Xeon, ~15%
of the round; the kernel reads the bf16 values once. Built at first use like the attention kernel (eagle3/attention.py);
elsewhere, or with EAGLE3_ARGMAX=0, the fp32 argmax runs."""
import os
from functools import lru_cache
from pathlib import Path

import torch

from .attention import build

SOURCE = Path(__file__).parent / "kernels" / "argmax.cpp"


@lru_cache(maxsize=1)
def available() -> bool:
    """Whether bf16 greedy picks run this kernel: EAGLE3_ARGMAX is not 0 and it builds."""
    if os.environ.get("EAGLE3_ARGMAX", "1") == "0":
        return False
    return build("eagle3_argmax", SOURCE, "greedy picks convert to fp32")


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """argmax over the last dim, first index on ties (logits.float().argmax(-1))."""
    if logits.dtype == torch.bfloat16 and logits.device.type == "cpu" and available():
        flat = logits.reshape(-1, logits.shape[-1]).contiguous()
        return torch.ops.eagle3_argmax.argmax_bf16(flat).view(logits.shape[:-1])
    return logits.float().argmax(-1)

"""The bf16 argmax kernel (eagle3/argmax.py) picks exactly what the fp32 argmax picks. Needs a C++ compiler."""
import pytest
import torch

from eagle3 import argmax

pytestmark = pytest.mark.skipif(not argmax.available(), reason="the argmax kernel did not build here")


def test_bf16_argmax_kernel_picks_what_the_fp32_argmax_picks():
    """eagle3/argmax.py: the first index of the largest value, as logits.float().argmax(-1), ties included."""
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(5, 3, 1000 + 7, generator=g) * 4).bfloat16()  # a tail past the 16-lane blocks
    logits[0, 0, 17] = logits[0, 0, 900] = logits[0, 0, 3] = 100.0       # ties: the first wins
    logits[1, 2, -1] = 100.0                                             # the largest in the tail
    logits[2, 1] = -float("inf")                                         # nothing larger than -inf: index 0
    logits[3, 0, 5:] = -3.0
    logits[3, 0, :5] = -4.0
    picked = argmax.greedy(logits)
    assert torch.equal(picked, logits.float().argmax(-1))
    assert picked[0, 0] == 3 and picked[1, 2] == 1006 and picked[2, 1] == 0 and picked[3, 0] == 5

"""The fp32 attention kernel (eagle3/attention.py): softmax attention within fp32 rounding of float64 SDPA, and each
query's bits fixed by the keys it sees, whatever else shares the call, where those keys sit, or whether the new keys
come as a second tensor (compiled steps) or in the cache (eager). Needs a C++ compiler, as the engine's build does."""
import pytest
import torch
import torch.nn.functional as F

from eagle3 import attention, layers

pytestmark = pytest.mark.skipif(not attention.available(), reason="the attention kernel did not build here")


def qkv(B, Hq, Hkv, T, S, D=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, Hq, T, D, generator=g), torch.randn(B, Hkv, S, D, generator=g) * 2,
            torch.randn(B, Hkv, S, D, generator=g), torch.rand(B, 1, T, S, generator=g) > 0.4)


@pytest.mark.parametrize("D", attention.HEAD_DIMS)
def test_matches_float64_attention(D):
    q, k, v, mask = qkv(3, 9, 3, 5, 70, D)
    mask[..., 0] = True  # every query sees a key
    out = attention.attend(q, k, v, mask)
    g = q.shape[1] // k.shape[1]
    ref = F.scaled_dot_product_attention(q.double(), k.double().repeat_interleave(g, 1),
                                         v.double().repeat_interleave(g, 1), attn_mask=mask)
    assert out.dtype == torch.float32 and out.shape == q.shape
    assert torch.allclose(out.double(), ref, atol=2e-6, rtol=0)


def test_a_query_sees_only_its_keys_in_order_wherever_they_sit():
    """The same query over the same visible keys: alone, with its keys moved behind masked padding, with other rows
    and queries around it, and with its keys split between the cache and a forward's new keys: the same bits."""
    q, k, v, mask = qkv(4, 6, 2, 7, 90)
    mask[..., 0] = True
    out = attention.attend(q, k, v, mask)
    for b, t in ((0, 0), (2, 3), (3, 6)):
        seen = mask[b, 0, t].nonzero().flatten()
        pad = 13
        k1 = torch.zeros(1, 2, pad + len(seen), 64)
        v1 = torch.zeros_like(k1)
        k1[0, :, pad:], v1[0, :, pad:] = k[b][:, seen], v[b][:, seen]
        m1 = torch.zeros(1, 1, 1, pad + len(seen), dtype=torch.bool)
        m1[..., pad:] = True
        alone = attention.attend(q[b:b + 1, :, t:t + 1], k1, v1, m1)
        assert torch.equal(alone[0, :, 0], out[b, :, t])
    split = attention.attend(q, k[:, :, :61], v[:, :, :61], mask, k[:, :, 61:], v[:, :, 61:])
    assert torch.equal(split, out)


def test_a_query_that_sees_nothing_gives_zeros():
    q, k, v, mask = qkv(2, 3, 3, 2, 10)
    mask[1] = False
    out = attention.attend(q, k, v, mask)
    assert torch.equal(out[1], torch.zeros_like(out[1])) and out.isfinite().all()


def test_bf16_models_attend_in_fp32_through_the_kernel():
    """Where the kernel builds, bf16 CPU models keep K/V in fp32 (not float64) and layers.attend runs it."""
    assert layers.cache_dtype(torch.zeros(1, dtype=torch.bfloat16), 64) == torch.float32
    q, k, v, mask = qkv(2, 6, 2, 3, 20)
    mask[..., 0] = True
    assert torch.equal(layers.attend(q, k, v, mask), attention.attend(q, k, v, mask))


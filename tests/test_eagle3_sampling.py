"""Speculative sampling is lossless: the tokens it emits follow the target's own (warped) distribution."""
import itertools

import pytest
import torch

from eagle3.verify import warp
from eagle3_helpers import decoder_for, small_vocab_target

PROMPT = [3, 1, 0, 1, 2]
N_SAMPLES = 6000
# chi-square 0.9999 quantiles by degrees of freedom (df = cells - 1); a correct sampler fails 1 in 10,000 runs
CHI2_9999 = {d: q for d, q in [(3, 21.1), (7, 29.9), (15, 42.6), (31, 61.1), (63, 94.5)]}


def _exact_joint(target, temperature, top_p, n=3):
    """P(t1, t2, t3 | PROMPT) under the warped target, by enumerating all V^3 continuations."""
    V = target.config.vocab_size
    seqs = torch.tensor([PROMPT + list(c) for c in itertools.product(range(V), repeat=n)])
    B, T = seqs.shape
    cache = target.model.new_cache(B, T)
    mask = torch.ones(T, T, dtype=torch.bool).tril().expand(B, T, T)
    logits, _ = target.model(seqs, torch.arange(T).expand(B, T), cache, mask)
    probs = warp(logits[:, len(PROMPT) - 1: -1], temperature, top_p=top_p)
    tok = seqs[:, len(PROMPT):]
    p = probs.gather(2, tok[..., None])[..., 0].prod(1).double()
    return {tuple(s): float(q) for s, q in zip(tok.tolist(), p)}


def _chi2(observed: dict, expected: dict, n):
    """Pearson chi-square with cells of expected count < 5 pooled into one."""
    small_o = small_e = 0.0
    stat, cells = 0.0, 0
    for key, p in expected.items():
        e, o = p * n, observed.get(key, 0)
        if e < 5:
            small_o, small_e = small_o + o, small_e + e
            continue
        stat += (o - e) ** 2 / e
        cells += 1
    if small_e > 0:
        stat += (small_o - small_e) ** 2 / max(small_e, 1e-9)
        cells += 1
    return stat, cells - 1


def _marginal(joint: dict, idx):
    out = {}
    for k, p in joint.items():
        key = tuple(k[i] for i in idx)
        out[key] = out.get(key, 0.0) + p
    return out


def _critical(df):
    # nearest tabulated df at or above; pooling makes df vary run to run
    return next(q for d, q in sorted(CHI2_9999.items()) if d >= df) if df <= 63 else df + 4.9 * (2 * df) ** 0.5


@pytest.mark.parametrize("temperature,top_p,drafter", [(0.7, 1.0, "eagle"), (1.0, 1.0, "eagle"), (1.0, 0.9, "eagle"),
                                                       (0.7, 1.0, "suffix"), (1.0, 0.9, "hybrid")])
def test_speculative_sampling_matches_target_distribution(temperature, top_p, drafter):
    target = small_vocab_target(vocab=4, seed=1, scale=0.15)
    dec = decoder_for(target, parallel_degree=2, depth=3, total_tokens=7, drafter=drafter)
    exact = _exact_joint(target, temperature, top_p)
    # suffix and hybrid drafting: 1000 rows at a time, so later rows find the earlier rows' outputs in the index
    res = dec.generate_ids([PROMPT] * N_SAMPLES, max_new_tokens=3, temperature=temperature, top_p=top_p,
                           batch_size=1000 if drafter in ("suffix", "hybrid") else N_SAMPLES, seed=1234)
    assert dec.last_stats["accept_length"] > 1.2  # the tree is really being accepted from
    seqs = [tuple(r.token_ids) for r in res]
    assert all(len(s) == 3 for s in seqs)
    counts = {}
    for s in seqs:
        counts[s] = counts.get(s, 0) + 1
    for idx in [(0, 1, 2), (1, 2), (2,)]:  # t2 and t3 come from verification rounds
        obs = {}
        for s, c in counts.items():
            key = tuple(s[i] for i in idx)
            obs[key] = obs.get(key, 0) + c
        stat, df = _chi2(obs, _marginal(exact, idx), N_SAMPLES)
        assert stat < _critical(df), f"tokens {idx}: chi2 {stat:.1f} with {df} df"


def test_biased_sampler_would_be_caught():
    """The check above has power: samples from the draft-agnostic but wrong distribution (temperature 1.0 vs the
    0.7 the target is warped with) fail it."""
    target = small_vocab_target(vocab=4, seed=1, scale=0.15)
    dec = decoder_for(target, parallel_degree=2, depth=3, total_tokens=7)
    exact = _exact_joint(target, 0.7, 1.0)
    res = dec.generate_ids([PROMPT] * N_SAMPLES, max_new_tokens=3, temperature=1.0, batch_size=N_SAMPLES, seed=7)
    obs = {}
    for r in res:
        obs[tuple(r.token_ids)] = obs.get(tuple(r.token_ids), 0) + 1
    stat, df = _chi2(obs, exact, N_SAMPLES)
    assert stat > _critical(df)


def test_sampling_is_reproducible_with_seed():
    target = small_vocab_target(vocab=8)
    dec = decoder_for(target)
    a = dec.generate_ids([PROMPT] * 4, max_new_tokens=12, temperature=0.8, seed=5)
    b = dec.generate_ids([PROMPT] * 4, max_new_tokens=12, temperature=0.8, seed=5)
    assert [r.token_ids for r in a] == [r.token_ids for r in b]

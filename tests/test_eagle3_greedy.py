"""Greedy speculative decoding is token-identical to vanilla greedy decoding of the same target."""
import random

import pytest

from eagle3 import SpeculativeDecoder, load_target
from eagle3.policy import PLAIN, SpeculationPolicy, bucket
from eagle3_helpers import decoder_for, random_prompts, small_vocab_target

TREES = [dict(parallel_degree=1, depth=1, total_tokens=2), dict(parallel_degree=2, depth=3, total_tokens=6),
         dict(parallel_degree=4, depth=5, total_tokens=16), dict(parallel_degree=3, depth=6, total_tokens=30)]


@pytest.fixture(scope="module")
def target():
    return small_vocab_target()


@pytest.mark.parametrize("tree", TREES, ids=lambda t: "k{parallel_degree}-d{depth}-n{total_tokens}".format(**t))
def test_greedy_matches_vanilla_on_random_prompts(target, tree):
    dec = decoder_for(target, **tree)
    prompts = random_prompts(50, target.config.vocab_size)
    vanilla = dec.generate_ids(prompts, max_new_tokens=16, speculative=False, batch_size=1)
    assert dec.last_stats["accept_length"] == 1.0
    for batch in (1, 5):
        spec = dec.generate_ids(prompts, max_new_tokens=16, batch_size=batch)
        assert [r.token_ids for r in spec] == [r.token_ids for r in vanilla]
        if tree["depth"] > 1:
            # the untrained head guesses tokens of an 8-token vocabulary often: multi-token commits are exercised
            assert dec.last_stats["accept_length"] > 1.15
        assert dec.last_stats["target_forwards"] < sum(r.stats["target_forwards"] for r in vanilla) or tree["depth"] == 1


@pytest.mark.parametrize("batch", [1, 5])
def test_greedy_matches_vanilla_in_bf16_with_int4(batch):
    """The reduced-precision CPU path is lossless too: int4 layers give each row the same bits at any row count and
    attention runs in float64, so a token verified among tree nodes is the token a plain step would pick."""
    import torch

    target = small_vocab_target(dtype=torch.bfloat16)
    assert target.model.layers[0].mlp.down_proj._int4 is not None
    dec = decoder_for(target, parallel_degree=4, depth=5, total_tokens=16)
    prompts = random_prompts(40, target.config.vocab_size, seed=3)
    vanilla = dec.generate_ids(prompts, max_new_tokens=24, speculative=False, batch_size=1)
    spec = dec.generate_ids(prompts, max_new_tokens=24, batch_size=batch)
    assert [r.token_ids for r in spec] == [r.token_ids for r in vanilla]
    assert dec.last_stats["accept_length"] > 1.15


def test_full_tree_accepts_every_level(target):
    """With k = vocabulary size and every node kept, the tree holds every continuation: each round must accept
    both drafted levels plus the bonus token, exactly."""
    V = target.config.vocab_size
    dec = decoder_for(target, parallel_degree=V, depth=2, total_tokens=1 + V + V * V)
    prompts = random_prompts(10, V, seed=1)
    vanilla = dec.generate_ids(prompts, max_new_tokens=31, speculative=False)
    spec = dec.generate_ids(prompts, max_new_tokens=31, batch_size=4)
    assert [r.token_ids for r in spec] == [r.token_ids for r in vanilla]
    assert dec.last_stats["accept_length"] == 3.0
    assert all(r.stats["rounds"] == 10 for r in spec)  # 1 token from prefill + 10 rounds x 3


class ScriptedPolicy(SpeculationPolicy):
    """Switches between plain steps and trees of every size in a fixed pseudo-random order: the worst case for the
    head's catch-up after plain steps."""

    def __init__(self, configured, seed=0):
        super().__init__(configured)
        self.rng = random.Random(seed)
        self.used = []

    def choose(self, rows, greedy):
        c = self.rng.choice(self.candidates + [PLAIN, PLAIN])
        self.used.append(c)
        return c


def test_switching_between_plain_steps_and_trees_stays_lossless(target):
    dec = decoder_for(target, adaptive=True, parallel_degree=4, depth=5, total_tokens=16)
    dec.policy = ScriptedPolicy(dec.policy.configured)
    prompts = random_prompts(12, target.config.vocab_size, seed=2)
    vanilla = dec.generate_ids(prompts, max_new_tokens=24, speculative=False)
    spec = dec.generate_ids(prompts, max_new_tokens=24, batch_size=5)
    assert [r.token_ids for r in spec] == [r.token_ids for r in vanilla]
    assert {PLAIN, (4, 5, 16), (2, 2, 3)} <= set(dec.policy.used)
    assert dec.last_stats["plain_steps"] > 0 and dec.last_stats["accept_length"] > 1.1
    assert sum(dec.last_stats["accept_hist"]) < dec.last_stats["rounds"]  # the histogram counts tree rounds only


def test_default_adaptive_decoder_is_lossless(target):
    dec = decoder_for(target, adaptive=True)
    prompts = random_prompts(16, target.config.vocab_size, seed=4)
    vanilla = dec.generate_ids(prompts, max_new_tokens=32, speculative=False)
    for batch in (1, 8):
        spec = dec.generate_ids(prompts, max_new_tokens=32, batch_size=batch)
        assert [r.token_ids for r in spec] == [r.token_ids for r in vanilla]
    assert dec.policy.seconds  # it measured rounds


def test_policy_measures_candidates_frugally_then_picks_the_fastest():
    pol = SpeculationPolicy((4, 5, 16), explore_every=10)
    assert pol.candidates == [PLAIN, (2, 2, 3), (2, 4, 6), (4, 5, 16)]
    assert SpeculationPolicy((2, 3, 5)).candidates == [PLAIN, (2, 2, 3), (2, 3, 5)]  # never above the configured
    # batch 1: the big tree wins; batch 8: trees lose, (2, 4, 6) by more than the margin, so (4, 5, 16) is never
    # tried; batch 32: (2, 2, 3) cannot win even with every draft accepted (3 tokens in 0.2 s < 1 in 0.05 s)
    cost = {(PLAIN, 8): 0.04, ((2, 2, 3), 8): 0.07, ((2, 4, 6), 8): 0.09, ((4, 5, 16), 8): 0.15,
            (PLAIN, 1): 0.02, ((2, 2, 3), 1): 0.022, ((2, 4, 6), 1): 0.024, ((4, 5, 16), 1): 0.027,
            (PLAIN, 32): 0.05, ((2, 2, 3), 32): 0.2, ((2, 4, 6), 32): 0.3, ((4, 5, 16), 32): 0.6}
    tau = {PLAIN: 1.0, (2, 2, 3): 1.6, (2, 4, 6): 2.0, (4, 5, 16): 2.4}
    picks = {1: [], 8: [], 32: []}
    for _ in range(400):
        for rows in picks:
            c = pol.choose(rows, True)
            picks[rows].append(c)
            pol.observe(c, rows, True, cost[(c, rows)], tau[c])
    tried = {1: set(pol.candidates), 8: {PLAIN, (2, 2, 3), (2, 4, 6)}, 32: {PLAIN, (2, 2, 3)}}
    for rows, best in ((1, (4, 5, 16)), (8, PLAIN), (32, PLAIN)):
        first = 3 * len(tried[rows])  # each measured: the first sample discarded, then two
        assert picks[rows][:first] == [c for c in pol.candidates if c in tried[rows] for _ in range(3)], rows
        assert set(picks[rows]) == tried[rows], rows
        later = picks[rows][first:]
        others = [i for i, c in enumerate(later) if c != best]
        assert len(others) <= 8, (rows, others)  # the rest: the best, bar a few re-measurements ...
        gaps = [b - a for a, b in zip(others, others[1:])]
        assert gaps == sorted(gaps) and (not gaps or gaps[-1] >= 4 * gaps[0]), (rows, others)  # ... ever rarer
    assert len([c for c in picks[1][12:] if c != (4, 5, 16)]) >= 2  # re-measurements do happen
    assert (2, 2, 3) not in picks[32][6:]  # hopeless: never again
    assert pol.summary() == {"1": (4, 5, 16), "5-8": PLAIN, "17-32": PLAIN}


def test_policy_compares_rounds_per_row_within_a_bucket():
    # Plain steps measured with 32 rows (0.32 s), the tree after rows retired, at 17 (0.2 s): per round the tree
    # looks faster (1.1 tokens in 0.2 s vs 1 in 0.32 s), per row it is slower (1.1 / 0.0118 vs 1 / 0.01).
    pol = SpeculationPolicy((2, 2, 3))
    for rows, cost, tau in ((32, 0.32, 1.0), (17, 0.2, 1.1)):
        for _ in range(3):
            c = pol.choose(rows, True)
            pol.observe(c, rows, True, cost, tau)
    assert [pol.choose(24, True) for _ in range(5)] == [PLAIN] * 5


def test_policy_re_measurements_stay_within_their_time_budget():
    # Plain steps win at this batch size, and each switch to a tree costs 0.5 s on top of its round (the head reading
    # the prompt): re-measuring every 10 rounds would spend most of the time on them.
    pol = SpeculationPolicy((2, 2, 3), explore_every=10, max_explore_every=10, budget=0.05)
    cost = {PLAIN: 0.05, (2, 2, 3): 0.08}
    total = probes = 0.0
    picks = []
    for _ in range(2000):
        c = pol.choose(8, True)
        picks.append(c)
        switch = 0.5 if c is not PLAIN and (len(picks) < 2 or picks[-2] is PLAIN) else 0.0
        pol.observe(c, 8, True, cost[c], 1.2 if c else 1.0, switch)
        total += cost[c] + switch
        probes += (cost[c] + switch) * (len(picks) > 6 and c is not PLAIN)
    assert 1 <= picks[6:].count((2, 2, 3)) and probes <= 0.05 * total + 0.58, (probes, total)
    assert pol.spent[bucket(8)][1] == pytest.approx(probes)


def test_finished_rows_make_room_for_waiting_prompts(target):
    """Continuous batching: speculative rows finish at different rounds, and each freed row takes the next waiting
    prompt at once, so every round runs with batch_size rows until no prompt waits."""
    dec = decoder_for(target, parallel_degree=2, depth=3, total_tokens=6)
    prompts = random_prompts(12, target.config.vocab_size, seed=6)
    vanilla = dec.generate_ids(prompts, max_new_tokens=20, speculative=False)
    calls, forward = [], dec.model.forward
    def spy(tokens, positions, cache, tree_mask, logits_at=None):  # noqa: E306
        calls.append((tokens.shape[0], logits_at is not None))  # prefills of joining prompts pass logits_at
        return forward(tokens, positions, cache, tree_mask, logits_at)
    dec.model.forward = spy
    spec = dec.generate_ids(prompts, max_new_tokens=20, batch_size=4)
    del dec.model.forward
    assert [r.token_ids for r in spec] == [r.token_ids for r in vanilla]
    joins = [i for i, (_, prefill) in enumerate(calls) if prefill]
    assert sum(calls[i][0] for i in joins) == 12 and len(joins) > 3  # prompts joined a few at a time, not in 3 chunks
    assert all(rows == 4 for rows, prefill in calls[: joins[-1]] if not prefill)


def test_vanilla_batched_matches_unbatched(target):
    dec = decoder_for(target)
    prompts = random_prompts(20, target.config.vocab_size, seed=3)
    one = dec.generate_ids(prompts, max_new_tokens=16, speculative=False, batch_size=1)
    many = dec.generate_ids(prompts, max_new_tokens=16, speculative=False, batch_size=8)
    assert [r.token_ids for r in one] == [r.token_ids for r in many]


def test_stats_are_consistent(target):
    dec = decoder_for(target, parallel_degree=3, depth=4, total_tokens=10)
    res = dec.generate_ids(random_prompts(6, 8, seed=5), max_new_tokens=20, batch_size=3)
    for r in res:
        s = r.stats
        assert s["new_tokens"] == len(r.token_ids) == 20 and r.finish_reason == "length"
        assert s["target_forwards"] == s["rounds"] + 1  # prefill + one verify per round
        assert 1.0 <= s["accept_length"] <= 5.0
        assert s["tokens_per_s"] > 0
    tot = dec.last_stats
    assert tot["new_tokens"] == 120 and tot["draft_time_s"] > 0 and tot["verify_time_s"] > 0


def test_eos_stops_a_row(target):
    dec = decoder_for(target)
    prompts = random_prompts(8, 8, seed=9)
    ref = dec.generate_ids(prompts, max_new_tokens=20, speculative=False)
    eos = ref[0].token_ids[5]
    target.eos_ids = [eos]
    try:
        for spec in (False, True):
            out = dec.generate_ids(prompts, max_new_tokens=20, speculative=spec, batch_size=4)
            for r, full in zip(out, ref):
                cut = full.token_ids.index(eos) if eos in full.token_ids else None
                assert r.token_ids == full.token_ids[:cut]
                assert r.finish_reason == ("stop" if cut is not None else "length")
    finally:
        target.eos_ids = []


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_real_default_target_greedy_identical(dtype):
    """Both dtypes the engine picks by hardware (bf16 with the GGUF's int4 weights, or fp32)."""
    target = load_target(dtype=dtype)
    dec = SpeculativeDecoder(target)
    prompts = ["What is the capital of France?", "Write a haiku about autumn.", "List three prime numbers.",
               "Explain what a CPU does in one sentence."]
    vanilla = dec.generate(prompts, max_new_tokens=24, speculative=False, batch_size=1)
    spec = dec.generate(prompts, max_new_tokens=24, batch_size=4)
    assert [r.token_ids for r in spec] == [r.token_ids for r in vanilla]
    assert "Paris" in vanilla[0].text


@pytest.mark.parametrize("speculative", [True, False])
def test_on_tokens_streams_each_prompts_output_in_order(target, speculative):
    """The streaming hook: per prompt (in the caller's order, whatever the batch order), the callback's tokens
    concatenate to the returned token_ids, arrive in several calls, and the output is unchanged by the hook."""
    dec = decoder_for(target, parallel_degree=2, depth=3, total_tokens=6)
    prompts = random_prompts(7, target.config.vocab_size, seed=3)
    plain = dec.generate_ids(prompts, max_new_tokens=16, batch_size=3, speculative=speculative)
    streamed, calls = [[] for _ in prompts], [0] * len(prompts)

    def on_tokens(i, tokens):
        assert tokens, "never an empty increment"
        streamed[i] += tokens
        calls[i] += 1

    hooked = dec.generate_ids(prompts, max_new_tokens=16, batch_size=3, speculative=speculative, on_tokens=on_tokens)
    assert [r.token_ids for r in hooked] == [r.token_ids for r in plain] == streamed
    assert all(n > 1 for n, r in zip(calls, plain) if len(r.token_ids) > 4)

"""Greedy speculative decoding is token-identical to vanilla greedy decoding of the same target."""
import pytest

from eagle3 import SpeculativeDecoder, load_target
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


def test_adaptive_tree_shrinks_with_batch_and_stays_lossless(target):
    dec = decoder_for(target, adaptive=True, parallel_degree=4, depth=5, total_tokens=16)
    assert dec.tree_shape(1) == (4, 5, 16)
    assert dec.tree_shape(2) == (2, 3, 4) and dec.tree_shape(8) == (2, 2, 3)
    assert decoder_for(target, adaptive=True, parallel_degree=1, depth=1, total_tokens=2).tree_shape(8) == (1, 1, 2)
    prompts = random_prompts(12, target.config.vocab_size, seed=2)
    vanilla = dec.generate_ids(prompts, max_new_tokens=16, speculative=False)
    spec = dec.generate_ids(prompts, max_new_tokens=16, batch_size=8)
    assert [r.token_ids for r in spec] == [r.token_ids for r in vanilla]
    assert dec.last_stats["accept_length"] > 1.1


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


def test_real_default_target_greedy_identical():
    target = load_target()
    dec = SpeculativeDecoder(target)
    prompts = ["What is the capital of France?", "Write a haiku about autumn.", "List three prime numbers.",
               "Explain what a CPU does in one sentence."]
    vanilla = dec.generate(prompts, max_new_tokens=24, speculative=False, batch_size=1)
    spec = dec.generate(prompts, max_new_tokens=24, batch_size=4)
    assert [r.token_ids for r in spec] == [r.token_ids for r in vanilla]
    assert "Paris" in vanilla[0].text

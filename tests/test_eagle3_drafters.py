"""Every drafter is lossless at temperature 0, the suffix drafter copies what a call has already seen, and the pieces
(suffix index, trie, graft, padded trees) do what they say."""
import pytest
import torch

from eagle3.drafters import DRAFTERS
from eagle3.drafters.hybrid import graft, surest
from eagle3.drafters.suffix import SuffixIndex, trie_nodes
from eagle3.tree import from_nodes
from eagle3.verify import verify_greedy, verify_sampling
from eagle3_helpers import decoder_for, random_prompts, small_vocab_target


@pytest.fixture(scope="module")
def target():
    return small_vocab_target()


@pytest.mark.parametrize("drafter", sorted(DRAFTERS))
def test_every_drafter_matches_vanilla_greedy(target, drafter):
    dec = decoder_for(target, drafter=drafter, parallel_degree=2, depth=4, total_tokens=8)
    prompts = random_prompts(16, target.config.vocab_size, seed=11)
    vanilla = dec.generate_ids(prompts, max_new_tokens=20, speculative=False)
    for batch in (1, 5):
        spec = dec.generate_ids(prompts, max_new_tokens=20, batch_size=batch)
        assert [r.token_ids for r in spec] == [r.token_ids for r in vanilla], batch
        assert dec.last_stats["accept_length"] > 1.15  # drafts are accepted, so multi-token commits are exercised


@pytest.mark.parametrize("drafter", ["suffix", "hybrid"])
def test_drafters_match_vanilla_in_bf16(drafter):
    target = small_vocab_target(dtype=torch.bfloat16)
    dec = decoder_for(target, drafter=drafter, adaptive=True)
    prompts = random_prompts(12, target.config.vocab_size, seed=3)
    vanilla = dec.generate_ids(prompts, max_new_tokens=24, speculative=False)
    spec = dec.generate_ids(prompts, max_new_tokens=24, batch_size=5)
    assert [r.token_ids for r in spec] == [r.token_ids for r in vanilla]


def test_suffix_drafter_copies_earlier_outputs_of_the_call(target):
    """A job whose items repeat: the rows that join later find the whole answer in the earlier rows' outputs, so
    nearly every round accepts the full depth. (Prompts of one length keep their order, so each batch of three
    holds three different prompts and the repeats join after the first copies finished.)"""
    prompts = random_prompts(3, target.config.vocab_size, seed=5, min_len=8, max_len=8) * 4
    dec = decoder_for(target, drafter="suffix", parallel_degree=2, depth=5, total_tokens=8)
    vanilla = dec.generate_ids(prompts, max_new_tokens=40, speculative=False)
    spec = dec.generate_ids(prompts, max_new_tokens=40, batch_size=3)
    assert [r.token_ids for r in spec] == [r.token_ids for r in vanilla]
    assert dec.last_stats["accept_length"] > 1.5
    assert all(r.stats["accept_length"] > 4 for r in spec[3:])  # the repeats: ~6 tokens (depth 5 + bonus) a round


def test_suffix_drafter_drafts_from_references(target):
    """A job's earlier outputs passed as references: the first rows of a call already copy from them."""
    prompts = random_prompts(4, target.config.vocab_size, seed=9, min_len=8, max_len=8)
    dec = decoder_for(target, drafter="suffix", parallel_degree=2, depth=5, total_tokens=8)
    vanilla = dec.generate_ids(prompts, max_new_tokens=40, speculative=False)
    alone = dec.generate_ids(prompts, max_new_tokens=40, batch_size=4)
    alone_tau = dec.last_stats["accept_length"]
    helped = dec.generate_ids(prompts, max_new_tokens=40, batch_size=4, references=[r.token_ids for r in vanilla])
    assert [r.token_ids for r in helped] == [r.token_ids for r in alone] == [r.token_ids for r in vanilla]
    assert dec.last_stats["accept_length"] > alone_tau + 1.5, (dec.last_stats["accept_length"], alone_tau)


def test_suffix_index_finds_the_longest_match_most_recent_first():
    idx = SuffixIndex(max_n=4)
    idx.extend("a", [1, 2, 3, 4, 1, 2, 3, 5])
    idx.extend("b", [9, 2, 3])
    # "2 3" occurs 3 times; "9 2 3" only at b's end (nothing after it), so the longest useful match is "2 3"
    assert idx.continuations(idx.seqs["b"], depth=2, limit=5) == (2, [[5], [4, 1]])
    assert idx.continuations([7, 7], depth=2, limit=5) == (0, [])
    idx.extend("b", [4])
    assert idx.continuations(idx.seqs["b"], depth=3, limit=5) == (3, [[1, 2, 3]])  # "2 3 4", in a


def test_suffix_index_holds_only_occurrences_that_something_followed():
    """Rows that share their text end in the same n-grams: were those ends indexed, each lookup would step over one
    per row before a useful occurrence (O(rows) per row and round)."""
    idx = SuffixIndex(max_n=3)
    for row in range(50):
        idx.extend(row, [5, 6, 7, 8])
    assert all(end < len(idx.seqs[key]) for occurrences in idx.where.values() for key, end in occurrences)
    assert len(idx.where[(7, 8)]) == 0 and len(idx.where[(6, 7)]) == 50
    assert idx.continuations(idx.seqs[49], depth=2, limit=3) == (0, [])  # "8" never had anything after it
    idx.extend(0, [9])
    assert idx.continuations(idx.seqs[49], depth=2, limit=3) == (3, [[9]])


def test_trie_keeps_shared_nodes_parents_first():
    conts = [[1, 2, 3], [1, 2, 4], [1, 5], [6]]
    assert trie_nodes(conts, k=2, budget=10, min_prob=0.0)[0] == [(0, 1), (0, 6), (1, 2), (1, 5), (3, 3), (3, 4)]
    assert trie_nodes(conts, k=2, budget=3, min_prob=0.0)[0] == [(0, 1), (0, 6), (1, 2)]
    assert trie_nodes(conts, k=1, budget=10, min_prob=0.5)[0] == [(0, 1), (1, 2)]  # on half of the lists at least
    assert trie_nodes(conts, k=2, budget=3, min_prob=0.0)[1] == [0.75, 0.25, 0.5]  # each node's share of the lists


def test_graft_merges_shared_prefixes():
    head, scores = [(0, 5), (0, 6), (1, 7)], [0.9, 0.05, 0.4]  # 5 -> 7, and 6
    assert graft(head, scores, [(0, 5), (1, 7), (2, 8)], [0.8, 0.8, 0.7]) == (head + [(3, 8)], [0.9, 0.05, 0.8, 0.7])
    assert graft(head, scores, [(0, 9)], [0.2]) == (head + [(0, 9)], scores + [0.2])


def test_surest_keeps_the_likeliest_nodes_with_their_ancestors():
    nodes, scores = [(0, 5), (0, 6), (1, 7), (3, 8), (2, 9)], [0.5, 0.4, 0.9, 0.8, 0.45]
    # 7 and 8 count at most their ancestor 5's 0.5; 9 (0.45) beats its parent 6 (0.4) only capped: 6 goes first
    assert surest(nodes, scores, 3) == ([(0, 5), (1, 7), (2, 8)], [0.5, 0.9, 0.8])
    assert surest(nodes, scores, 4) == ([(0, 5), (0, 6), (1, 7), (3, 8)], [0.5, 0.4, 0.9, 0.8])
    assert surest(nodes, scores, 5) == (nodes, scores)


def test_hybrid_trees_keep_the_configured_size(target, monkeypatch):
    """The head's tree plus grafted suffix chains stays within total_tokens (larger trees cost a larger verify than
    the one configured, and compiled steps a larger bucket); still lossless."""
    from eagle3.drafters.hybrid import HybridDrafter

    sizes, real = [], HybridDrafter.propose

    def propose(self, batch, shape):
        tree = real(self, batch, shape)
        sizes.append(tree.size)
        return tree

    prompts = random_prompts(3, target.config.vocab_size, seed=5, min_len=8, max_len=8) * 3  # repeats: suffix matches
    dec = decoder_for(target, drafter="hybrid", parallel_degree=2, depth=4, total_tokens=6, adaptive=False)
    vanilla = dec.generate_ids(prompts, max_new_tokens=30, speculative=False)
    monkeypatch.setattr(HybridDrafter, "propose", propose)
    spec = dec.generate_ids(prompts, max_new_tokens=30, batch_size=3)
    assert [r.token_ids for r in spec] == [r.token_ids for r in vanilla]
    assert sizes and max(sizes) == 6


def test_padding_nodes_are_never_accepted():
    """Row 1 has no draft; its padding node carries the target's own next token and must still be rejected."""
    tree = from_nodes(torch.tensor([3, 4]), [[(0, 1), (1, 2)], []])
    assert tree.valid.tolist() == [[True, True, True], [True, False, False]]
    logits = torch.zeros(2, 3, 8)
    logits[0, 0, 1] = logits[0, 1, 2] = logits[0, 2, 6] = 5.0
    logits[1, :, 0] = 5.0  # the padding nodes hold token 0, the target's choice
    acc = verify_greedy(tree, logits)
    assert acc.length.tolist() == [3, 1] and acc.bonus.tolist() == [6, 0]
    probs = torch.softmax(logits * 10, -1)
    acc = verify_sampling(tree, probs, generator=torch.Generator().manual_seed(0))
    assert acc.length.tolist() == [3, 1]


def test_head_catch_up_reads_a_bounded_window_and_stays_lossless(target):
    """After a long prompt (or a long run of plain steps) the head reads only the last CATCH_UP pairs of a row before
    its next tree, so a probe never costs a head forward over everything skipped; the output is unchanged."""
    from eagle3.batch import LiveBatch
    from eagle3.drafters.eagle import CATCH_UP, EagleDrafter

    dec = decoder_for(target, parallel_degree=2, depth=3, total_tokens=6)
    long_prompts = random_prompts(3, target.config.vocab_size, seed=21, min_len=CATCH_UP + 40, max_len=CATCH_UP + 60)
    batch = LiveBatch(target.model, long_prompts, [8] * 3, [], 3, CATCH_UP + 80)
    drafter = EagleDrafter(target, dec.head, dec.configured)
    drafter.join(batch, *batch.admit(lambda logits: logits.argmax(-1)))
    drafter.prepare(batch)
    assert drafter.cache.lens.tolist() == [CATCH_UP] * 3
    vanilla = dec.generate_ids(long_prompts, max_new_tokens=12, speculative=False)
    spec = dec.generate_ids(long_prompts, max_new_tokens=12, batch_size=2)
    assert [r.token_ids for r in spec] == [r.token_ids for r in vanilla]

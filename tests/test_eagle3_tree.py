"""Tree mask, path selection, greedy acceptance and KV commit, on hand-made inputs."""
import torch

from eagle3.layers import KVCache, attention_mask
from eagle3.tree import Tree, ancestor_mask, draft_tree
from eagle3.verify import verify_greedy, warp
from eagle3_helpers import decoder_for, small_vocab_target

#        0
#      /   \
#     1     2
#    / \     \
#   3   4     5
#   |
#   6
PARENTS = torch.tensor([[0, 0, 0, 1, 1, 2, 3]])


def test_ancestor_mask_and_depth():
    mask, depth = ancestor_mask(PARENTS)
    assert depth.tolist() == [[0, 1, 1, 2, 2, 2, 3]]
    expect = {0: [0], 1: [0, 1], 2: [0, 2], 3: [0, 1, 3], 4: [0, 1, 4], 5: [0, 2, 5], 6: [0, 1, 3, 6]}
    for i, anc in expect.items():
        assert torch.nonzero(mask[0, i]).flatten().tolist() == anc


def test_ancestor_mask_matches_a_walk_up_the_parents_on_random_trees():
    g = torch.Generator().manual_seed(0)
    for N in (1, 2, 3, 4, 5, 8, 9, 16, 17, 33):
        # random trees (each node's parent an earlier node), and a chain: the deepest tree of N nodes
        trees = [torch.cat([torch.zeros(1, dtype=torch.long), torch.randint(0, 1 << 30, (N - 1,), generator=g)
                            % torch.arange(1, N).clamp(min=1)]) for _ in range(3)] + [(torch.arange(N) - 1).clamp(min=0)]
        parents = torch.stack(trees)
        mask, depth = ancestor_mask(parents)
        for b, ps in enumerate(parents.tolist()):
            for i in range(N):
                anc, j = {i}, i
                while j:
                    j = ps[j]
                    anc.add(j)
                assert set(torch.nonzero(mask[b, i]).flatten().tolist()) == anc, (N, b, i)
                assert depth[b, i] == len(anc) - 1


def _tree(tokens):
    mask, depth = ancestor_mask(PARENTS)
    return Tree(torch.tensor([tokens]), PARENTS, depth, mask)


def _logits_preferring(next_of, V=10):
    """Logits whose argmax at node i is next_of[i]."""
    lg = torch.zeros(1, len(next_of), V)
    for i, t in enumerate(next_of):
        lg[0, i, t] = 5.0
    return lg


def test_greedy_accepts_longest_matching_path():
    tree = _tree([9, 1, 2, 3, 4, 5, 6])
    # target: after root -> 1, after node1 -> 3, after node3 -> 6, after node6 -> 7 (bonus)
    acc = verify_greedy(tree, _logits_preferring([1, 3, 0, 6, 0, 0, 7]))
    assert acc.length.tolist() == [4] and acc.path.tolist() == [[0, 1, 3, 6]] and acc.bonus.tolist() == [7]


def test_greedy_rejects_child_of_rejected_parent():
    tree = _tree([9, 1, 2, 3, 4, 5, 6])
    # root wants 2 (node 2), node 2 wants 8 (node 5 has 5: reject); node 1 would match its child but is rejected
    acc = verify_greedy(tree, _logits_preferring([2, 3, 8, 6, 0, 0, 7]))
    assert acc.length.tolist() == [2] and acc.path[0, :2].tolist() == [0, 2] and acc.bonus.tolist() == [8]


def test_greedy_nothing_accepted_yields_target_token():
    tree = _tree([9, 1, 2, 3, 4, 5, 6])
    acc = verify_greedy(tree, _logits_preferring([7, 0, 0, 0, 0, 0, 0]))
    assert acc.length.tolist() == [1] and acc.path[0, 0] == 0 and acc.bonus.tolist() == [7]


def test_threshold_accepts_near_top_tokens():
    tree = _tree([9, 1, 2, 3, 4, 5, 6])
    lg = torch.full((1, 7, 10), -10.0)
    lg[0, 0, 5], lg[0, 0, 1] = 2.0, 1.9   # root: argmax 5, node 1's token "1" is close behind
    lg[0, 1, 0] = 3.0                       # after node 1: argmax 0
    strict = verify_greedy(tree, lg, threshold=1.0)
    loose = verify_greedy(tree, lg, threshold=0.8)
    assert strict.length.tolist() == [1] and strict.bonus.tolist() == [5]
    assert loose.length.tolist() == [2] and loose.path[0, :2].tolist() == [0, 1] and loose.bonus.tolist() == [0]


def test_warp_top_k_top_p():
    lg = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    assert torch.allclose(warp(lg, 1.0), torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    assert torch.allclose(warp(lg, 1.0, top_k=2), torch.tensor([[0.625, 0.375, 0, 0]]))
    assert torch.allclose(warp(lg, 1.0, top_p=0.7), torch.tensor([[0.625, 0.375, 0, 0]]))
    assert warp(lg, 0.5)[0, 0] > 0.5  # lower temperature sharpens


def test_attention_mask_prefix_and_block():
    lens = torch.tensor([2, 0])
    tm = torch.tensor([[[1, 0], [1, 1]], [[1, 0], [0, 1]]], dtype=torch.bool)
    m = attention_mask(lens, tm, 4)[:, 0].int().tolist()
    assert m[0] == [[1, 1, 1, 0], [1, 1, 1, 1]]
    assert m[1] == [[1, 0, 0, 0], [0, 1, 0, 0]]


def test_kv_commit_moves_accepted_rows_and_drops_rest():
    c = KVCache(layers=2, batch=2, kv_heads=1, max_len=10, head_dim=1, dtype=torch.float32, device="cpu")
    c.lens[:] = torch.tensor([3, 1])
    c.k[:, :, 0, :, 0] = torch.arange(10.0)  # slot s holds value s
    c.v.copy_(c.k * 10)
    # row 0 accepted tree nodes [0, 2, 5] (slots 3, 5, 8); row 1 only the root (slot 1)
    c.commit(torch.tensor([[0, 2, 5], [0, 0, 0]]), torch.tensor([3, 1]))
    assert c.lens.tolist() == [6, 2]
    assert c.k[0, 0, 0, :6, 0].tolist() == [0, 1, 2, 3, 5, 8]
    assert c.v[1, 0, 0, :6, 0].tolist() == [0, 10, 20, 30, 50, 80]
    assert c.k[1, 1, 0, :2, 0].tolist() == [0, 1]


def test_draft_tree_shape_and_order():
    target = small_vocab_target()
    dec = decoder_for(target, parallel_degree=3, depth=4, total_tokens=12)
    head, embed = dec.head, target.model.embed_tokens
    hc = head.new_cache(2, 64)
    hc.lens[:] = torch.tensor([5, 3])
    out = torch.randn(2, target.config.hidden_size, dtype=torch.float64)
    tree = draft_tree(head, embed, torch.tensor([1, 2]), out, hc, 3, 4, 12)
    assert tree.tokens.shape == (2, 12) and tree.tokens[:, 0].tolist() == [1, 2]
    assert (tree.parents[:, 1:] < torch.arange(1, 12)).all()  # parents precede children
    assert int(tree.depth.max()) <= 4 and (tree.depth[:, 1:] >= 1).all()
    for b in range(2):  # siblings carry distinct tokens
        for p in range(12):
            kids = tree.tokens[b, 1:][tree.parents[b, 1:] == p].tolist()
            assert len(kids) == len(set(kids))
    assert hc.lens.tolist() == [5, 3]  # drafting never commits to the head's cache


def test_kv_cache_keep_reorders_rows_in_place_or_by_copy():
    from eagle3.batch import Rows
    rows = Rows([4] * 6, eos=[])
    assert rows.admit(8, 0.0) == list(range(6)) and not rows.waiting
    rows.finish[1] = rows.finish[4] = "length"
    keep = rows.retire(0.0)
    assert keep == [0, 5, 2, 3] and rows.live == [0, 5, 2, 3]  # the last live row fills the first hole
    for order in (keep, [0, 2, 3], [3, 0, 1]):  # in place (the first two) and by copy (the last)
        c = KVCache(layers=2, batch=6, kv_heads=1, max_len=3, head_dim=2, dtype=torch.float32, device="cpu")
        c.k.copy_(torch.randn(c.k.shape))
        c.v.copy_(torch.randn(c.v.shape))
        c.lens.copy_(torch.arange(6))
        want_k, want_v = c.k[:, order].clone(), c.v[:, order].clone()
        c.keep(order)
        assert torch.equal(c.k, want_k) and torch.equal(c.v, want_v) and c.lens.tolist() == order

"""Draft trees. `draft_tree` is the dynamic tree of EAGLE-2/3: expand the `k` best frontier nodes for `depth` levels,
`k` children each, then keep the `total_tokens - 1` nodes with the highest cumulative draft log-probability; every
row gets its own tree of the same size. `from_nodes` builds a batch's trees from per-row node lists of any sizes
(drafters that are not the head), padding short rows with nodes verification never accepts."""
from dataclasses import dataclass

import torch


@dataclass
class Tree:
    tokens: torch.Tensor   # [B, N] target token ids; node 0 is the root (last committed, not yet verified, token)
    parents: torch.Tensor  # [B, N] parent node index (root: 0)
    depth: torch.Tensor    # [B, N] root = 0
    mask: torch.Tensor     # [B, N, N] node i sees node j: j is i or an ancestor of i
    valid: torch.Tensor | None = None  # [B, N] False: padding, never accepted (None: every node is a draft)
    # [B, N] the drafter's confidence that a node is accepted: its cumulative draft probability (root 1, padding 0).
    # The draft budget (eagle3/budget.py) calibrates it against measured acceptance and keeps the surest nodes.
    score: torch.Tensor | None = None

    @property
    def size(self):
        return self.tokens.shape[1]

    def nodes(self):
        """Per row, its draft nodes as (parent, token) pairs; node i + 1 is pair i. The inverse of from_nodes."""
        valid = [[True] * self.size] * len(self.tokens) if self.valid is None else self.valid.tolist()
        return [[(p, t) for p, t, ok in zip(ps[1:], ts[1:], vs[1:]) if ok]
                for ps, ts, vs in zip(self.parents.tolist(), self.tokens.tolist(), valid)]

    def node_scores(self):
        """Per row, the scores of the nodes that nodes() lists (1.0 where the drafter gave none)."""
        valid = [[True] * self.size] * len(self.tokens) if self.valid is None else self.valid.tolist()
        score = [[1.0] * self.size] * len(self.tokens) if self.score is None else self.score.tolist()
        return [[s for s, ok in zip(ss[1:], vs[1:]) if ok] for ss, vs in zip(score, valid)]


def root_only(root_tokens):
    """The tree of a plain decode step: each row's root alone."""
    B, dev = len(root_tokens), root_tokens.device
    zeros = torch.zeros(B, 1, dtype=torch.long, device=dev)
    return Tree(root_tokens[:, None], zeros, zeros, torch.ones(B, 1, 1, dtype=torch.bool, device=dev))


def from_nodes(root_tokens, nodes, scores=None):
    """A batch's trees from per-row lists of (parent, token) draft nodes (node i + 1 is pair i; parents precede
    children) and, optionally, per-row lists of their scores (Tree.score). Rows are padded to the longest with
    nodes under the root that are marked invalid."""
    B, dev = len(root_tokens), root_tokens.device
    N = 1 + max(map(len, nodes))
    parents = [[0] * N for _ in range(B)]
    tokens = [[0] * N for _ in range(B)]
    valid = [[True] + [False] * (N - 1) for _ in range(B)]
    score = [[1.0] + [0.0] * (N - 1) for _ in range(B)]
    for b, row in enumerate(nodes):
        for i, (p, t) in enumerate(row, 1):
            parents[b][i], tokens[b][i], valid[b][i] = p, t, True
        if scores is not None:
            score[b][1: 1 + len(row)] = scores[b]
    tokens = torch.tensor(tokens, device=dev)
    tokens[:, 0] = root_tokens
    parents = torch.tensor(parents, device=dev)
    mask, depth = ancestor_mask(parents)
    return Tree(tokens, parents, depth, mask, torch.tensor(valid, device=dev),
                None if scores is None else torch.tensor(score, device=dev))


def prune(tree, keep):
    """The sub-trees of the nodes `keep` [B, n] (per row ascending node indices, 0 first, closed under ancestors)."""
    B, n = keep.shape
    dev = keep.device
    node_of = torch.zeros(B, tree.size, dtype=torch.long, device=dev)  # old node -> new node
    node_of.scatter_(1, keep, torch.arange(n, device=dev).expand(B, n))
    parents = node_of.gather(1, tree.parents.gather(1, keep))
    mask, depth = ancestor_mask(parents)
    pick = lambda x: None if x is None else x.gather(1, keep)  # noqa: E731
    return Tree(tree.tokens.gather(1, keep), parents, depth, mask, pick(tree.valid), pick(tree.score))


def ancestor_mask(parents):
    """[B, N] parent indices (root: 0) -> [B, N, N] ancestor-or-self mask, and depths. By pointer doubling: after s
    steps each node's mask holds its ancestors up to 2^s generations up and `jump` its 2^s-th one, so a tree of N
    nodes takes ~log2(N) steps of three batched ops rather than a loop over its nodes (a 16-node tree: 4 steps
    instead of 15; that loop ran twice a round and cost ~0.25 ms of a ~9 ms batch-1 round on a 2-core CPU)."""
    B, N = parents.shape
    eye = torch.eye(N, dtype=torch.bool, device=parents.device)
    mask = eye | torch.zeros(B, N, N, dtype=torch.bool, device=parents.device).scatter_(2, parents[..., None], True)
    jump = parents
    for _ in range(max(N - 2, 0).bit_length()):  # 2^s >= N - 1, the deepest a node can be
        mask = mask | mask.gather(1, jump[..., None].expand(B, N, N))
        jump = jump.gather(1, jump)
    return mask, mask.sum(-1) - 1


@torch.no_grad()
def draft_tree(head, embed, root_tokens, root_out, head_cache, k, depth, total_tokens):
    """Grow a tree under `root_tokens` [B] from the head's output `root_out` [B, h] at the last committed pair.

    Frontier nodes run through the head at once; their K/V sit in head_cache after the committed pairs (slots
    lens + 0..(depth-1)*k-1) and are discarded by not advancing lens."""
    B, dev = root_tokens.shape[0], root_tokens.device
    logp = torch.log_softmax(head.logits(root_out).float(), -1)
    score, tok = logp.topk(k, -1)                             # [B, k] first level
    cand_tok, cand_score, cand_parent = [tok], [score], [torch.full((B, k), -1, device=dev)]
    front_idx = torch.arange(k, device=dev).expand(B, k)      # candidate index of each frontier node
    front_tok, front_score = tok, score
    front_hidden = root_out[:, None].expand(B, k, root_out.shape[-1])
    anc = torch.zeros(B, k, 0, dtype=torch.bool, device=dev)  # which earlier temp slots each frontier node sees
    eye = torch.eye(k, dtype=torch.bool, device=dev).expand(B, k, k)
    n_cand = k
    for d in range(1, depth):
        mask = torch.cat([anc, eye], -1)
        pos = (head_cache.lens + d - 1)[:, None].expand(B, k)
        out = head(embed(head.to_target_ids(front_tok)), front_hidden, pos, head_cache, mask, offset=(d - 1) * k)
        lp = torch.log_softmax(head.logits(out).float(), -1)
        child_lp, child_tok = lp.topk(k, -1)                  # [B, k, k]
        child_score = (front_score[..., None] + child_lp).flatten(1)
        cand_tok.append(child_tok.flatten(1))
        cand_score.append(child_score)
        cand_parent.append(front_idx[..., None].expand(B, k, k).flatten(1))
        front_score, sel = child_score.topk(k, -1)
        par = sel // k
        front_idx = n_cand + sel
        front_tok = child_tok.flatten(1).gather(1, sel)
        front_hidden = out.gather(1, par[..., None].expand(-1, -1, out.shape[-1]))
        anc = mask.gather(1, par[..., None].expand(-1, -1, mask.shape[-1]))
        n_cand += k * k
    return _select(torch.cat(cand_tok, 1), torch.cat(cand_score, 1), torch.cat(cand_parent, 1), root_tokens, head,
                   total_tokens, k, depth)


def _select(cand_tok, cand_score, cand_parent, root_tokens, head, total_tokens, k, depth):
    """Keep the best total_tokens-1 candidates, in candidate order (so parents precede children)."""
    B, C = cand_tok.shape
    dev = cand_tok.device
    n = min(total_tokens - 1, C)
    # A child never outscores its parent (log p <= 0); the tiny per-level penalty breaks ties (log p == 0) so the
    # kept set is always closed under ancestors.
    level = torch.cat([torch.zeros(k, device=dev)] + [torch.full((k * k,), float(d), device=dev)
                                                      for d in range(1, depth)])
    keep = (cand_score - 1e-6 * level).topk(n, -1).indices.sort(-1).values        # [B, n]
    node_of = torch.zeros(B, C, dtype=torch.long, device=dev)                       # candidate -> node index
    node_of.scatter_(1, keep, torch.arange(1, n + 1, device=dev).expand(B, n))
    par_c = cand_parent.gather(1, keep)
    parents = torch.where(par_c < 0, 0, node_of.gather(1, par_c.clamp(min=0)))
    tokens = torch.cat([root_tokens[:, None], head.to_target_ids(cand_tok.gather(1, keep))], 1)
    parents = torch.cat([torch.zeros(B, 1, dtype=torch.long, device=dev), parents], 1)
    mask, dep = ancestor_mask(parents)
    score = torch.cat([torch.ones(B, 1, device=dev), cand_score.gather(1, keep).exp()], 1)
    return Tree(tokens, parents, dep, mask, score=score)

"""Verification of a draft tree against the target's logits at every tree node.

Greedy (temperature 0): a node is accepted when its token is the target's argmax at its parent and its parent is
accepted; the deepest accepted node ends the path and the target's argmax there is the bonus token. The result is
exactly what greedy decoding of the target alone produces.

Sampling: recursive rejection sampling with point-mass proposals (the tree's children are top-k, not sampled): at
each accepted node try its children in turn, accepting child x with probability p(x) under the target's (warped)
distribution, else zero p(x) and renormalise; if all are rejected, sample the residual. Every emitted token is then
distributed exactly as the target's.

validation_threshold t < 1 also accepts a child x when p(x) >= t * max p: longer accepted paths, but the output is no
longer exactly the target's (lossy). t = 1 is strict.

Padding nodes (tree.valid False: a row's drafter proposed fewer nodes than the batch's largest tree) are never
accepted, under either rule."""
from dataclasses import dataclass

import torch

from . import argmax


@dataclass
class Accepted:
    path: torch.Tensor    # [B, D+1] node indices root..last accepted (padded by repeating the last)
    length: torch.Tensor  # [B] nodes on the path (>= 1: the root)
    bonus: torch.Tensor   # [B] the target's own token after the path


def warp(logits, temperature, top_k=0, top_p=1.0):
    """Target probabilities after temperature, top-k and top-p (the same warp the vanilla sampler uses)."""
    logits = logits.float() / temperature
    if top_k and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, -1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, -1)
    if top_p < 1.0:
        sp, si = probs.sort(-1, descending=True)
        drop = sp.cumsum(-1) - sp > top_p  # keep the smallest prefix whose mass reaches top_p
        probs = probs.scatter(-1, si, sp.masked_fill(drop, 0.0))
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def _path_to(tree, last):
    """Root-first node indices of the path to `last` [B], as [B, depth+1] padded with `last`. The ancestors of a
    node, in tree order, are its path (parents precede children)."""
    N = tree.size
    idx = torch.arange(N, device=last.device)
    anc = tree.mask[torch.arange(len(last), device=last.device), last]
    path = torch.where(anc, idx, N).sort(-1).values[:, : int(tree.depth.max()) + 1]
    return torch.where(path == N, last[:, None], path)


def greedy(logits):
    """The target's greedy token: argmax taken in fp32 (ties: the lowest index). bf16's CPU argmax is ~3-4x slower,
    so bf16 logits on a CPU go through eagle3/argmax.py's kernel, which compares the same fp32 values without writing
    them out. Plain decoding and verification both pick with this."""
    return argmax.greedy(logits)


def verify_greedy(tree, logits, threshold=1.0):
    B, N = tree.tokens.shape
    rows = torch.arange(B, device=logits.device)
    pred = greedy(logits)  # [B, N] the target's token after each node
    good = tree.tokens == pred.gather(1, tree.parents)  # each node is its parent's greedy token
    if threshold < 1.0:
        probs = torch.softmax(logits.float(), -1)
        p_tok = probs[rows[:, None], tree.parents, tree.tokens]  # [B, N]: each node's token at its parent
        good |= p_tok >= threshold * probs.max(-1).values.gather(1, tree.parents)
    if tree.valid is not None:
        good &= tree.valid
    good[:, 0] = True
    # A node is accepted when it and every ancestor are good: one batched test over the ancestor mask, not a loop
    # over the nodes (15 rounds of small ops for a 16-node tree).
    ok = (~tree.mask | good[:, None, :]).all(-1)
    # deepest accepted node (first in tree order on ties: the higher-scored draft)
    key = torch.where(ok, tree.depth * N + (N - 1 - torch.arange(N, device=ok.device)), -1)
    last = key.argmax(1)
    return Accepted(_path_to(tree, last), tree.depth[rows, last] + 1, pred[rows, last])


def verify_sampling(tree, probs, threshold=1.0, generator=None):
    """probs: [B, N, V] warped target probabilities at every node."""
    B, N = tree.tokens.shape
    parents, tokens = tree.parents.tolist(), tree.tokens.tolist()
    valid = [[True] * N] * B if tree.valid is None else tree.valid.tolist()
    u = torch.rand(B, N, generator=generator, device=probs.device).tolist()
    last, bonus = [], []
    for b in range(B):
        children = [[] for _ in range(N)]
        for i in range(1, N):
            if valid[b][i]:
                children[parents[b][i]].append(i)
        node = 0
        while True:
            p = probs[b, node].clone()
            nxt = None
            for c in children[node]:
                x = tokens[b][c]
                px = float(p[x])
                if (threshold < 1.0 and px >= threshold * float(p.max())) or u[b][c] < px:
                    nxt = c
                    break
                p[x] = 0.0
                s = float(p.sum())
                if s <= 0.0:  # the children held all the mass: rounding, accept
                    nxt = c
                    break
                p /= s
            if nxt is None:
                bonus.append(int(torch.multinomial(p, 1, generator=generator)))
                last.append(node)
                break
            node = nxt
    last = torch.tensor(last, device=probs.device)
    rows = torch.arange(B, device=probs.device)
    return Accepted(_path_to(tree, last), tree.depth[rows, last] + 1,
                    torch.tensor(bonus, device=probs.device))

"""The head's tree plus the suffix drafter's confident matches: where a row's text repeats what this call has seen
(a long suffix match that most recent occurrences agree on), the suffix chain is grafted onto the head's tree, so
copying runs as deep as the tree may go; elsewhere the tree is the head's alone. A merged tree keeps its surest
total_tokens - 1 nodes, as the head's does."""
from ..tree import from_nodes
from .base import Drafter
from .eagle import EagleDrafter
from .suffix import SuffixDrafter


def graft(nodes, scores, extra, extra_scores):
    """Add the (parent, token) nodes of tree `extra` to tree `nodes` (same numbering rules), merging a node into an
    existing one where the parent and token agree; a merged node keeps the higher of its two scores. Returns the
    new node and score lists."""
    nodes, scores = list(nodes), list(scores)
    child = {(p, t): i for i, (p, t) in enumerate(nodes, 1)}
    where = {0: 0}  # extra's node -> node in the merged tree
    for j, ((p, t), s) in enumerate(zip(extra, extra_scores), 1):
        key = (where[p], t)
        if key not in child:
            nodes.append(key)
            scores.append(s)
            child[key] = len(nodes)
        scores[child[key] - 1] = max(scores[child[key] - 1], s)
        where[j] = child[key]
    return nodes, scores


def surest(nodes, scores, most):
    """The `most` nodes of a tree likeliest to be accepted, renumbered. A node is accepted only with its parent, so its
    score counts capped by its parent's; ties go to the lower index (parents precede children), so the kept nodes
    include every ancestor of each."""
    if len(nodes) <= most:
        return nodes, scores
    capped = []
    for (p, _), s in zip(nodes, scores):
        capped.append(min(s, capped[p - 1]) if p else s)
    keep = sorted(sorted(range(len(nodes)), key=lambda i: (-capped[i], i))[:most])
    new = {0: 0}
    new.update((i + 1, n) for n, i in enumerate(keep, 1))
    return [(new[nodes[i][0]], nodes[i][1]) for i in keep], [scores[i] for i in keep]


class HybridDrafter(Drafter):
    def __init__(self, target, head, configured):
        super().__init__(target, head, configured)
        self.eagle = EagleDrafter(target, head, configured)
        self.suffix = SuffixDrafter(target, head, configured, min_match=3, min_prob=0.5)

    def join(self, batch, feats, lens):
        for part in (self.eagle, self.suffix):
            part.join(batch, feats, lens)

    def retire(self, keep):
        for part in (self.eagle, self.suffix):
            part.retire(keep)

    def prepare(self, batch):
        for part in (self.eagle, self.suffix):
            part.prepare(batch)

    def propose(self, batch, shape):
        k, depth, total = shape
        tree = self.eagle.propose(batch, shape)
        # at most `depth` suffix nodes per row: the trees stay within the room the KV caches keep past a row's end;
        # then the surest total - 1 of the merged nodes, as the shape allows
        extra = [self.suffix.draft(slot, k, depth, depth) for slot in batch.rows.live]
        merged = [surest(*graft(h, hs, *e), total - 1) for h, hs, e in zip(tree.nodes(), tree.node_scores(), extra)]
        return from_nodes(batch.root, *zip(*merged))

    def observe(self, batch, tree, acc, feats, emitted):
        for part in (self.eagle, self.suffix):
            part.observe(batch, tree, acc, feats, emitted)

"""The head's tree plus the suffix drafter's confident matches: where a row's text repeats what this call has seen
(a long suffix match that most recent occurrences agree on), the suffix chain is grafted onto the head's tree, so
copying runs as deep as the tree may go; elsewhere the tree is the head's alone."""
from ..tree import from_nodes
from .base import Drafter
from .eagle import EagleDrafter
from .suffix import SuffixDrafter


def graft(nodes, extra):
    """Add the (parent, token) nodes of tree `extra` to tree `nodes` (same numbering rules), merging a node into an
    existing one where the parent and token agree. Returns the new list."""
    nodes = list(nodes)
    child = {(p, t): i for i, (p, t) in enumerate(nodes, 1)}
    where = {0: 0}  # extra's node -> node in the merged tree
    for j, (p, t) in enumerate(extra, 1):
        key = (where[p], t)
        if key not in child:
            nodes.append(key)
            child[key] = len(nodes)
        where[j] = child[key]
    return nodes


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
        k, depth, _ = shape
        head = self.eagle.propose(batch, shape).nodes()
        # at most `depth` suffix nodes per row: the trees stay within the room the KV caches keep past a row's end
        extra = [self.suffix.draft(slot, k, depth, depth) for slot in batch.rows.live]
        return from_nodes(batch.root, [graft(h, e) for h, e in zip(head, extra)])

    def observe(self, batch, tree, acc, feats, emitted):
        for part in (self.eagle, self.suffix):
            part.observe(batch, tree, acc, feats, emitted)

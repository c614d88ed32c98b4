"""Suffix drafting: draft what followed, earlier in this generate() call, the longest suffix of a row's text.

One index per call, shared by all rows: the call's references (a bulk job's earlier outputs), every prompt that
joined and every token emitted so far. Bulk jobs copy
(rationales quote their input, rewrites and extractions repeat it, items of one job share structure), and there a
long suffix match predicts the next tokens well for free: no model runs to draft. The idea is SuffixDecoding's
(vLLM `suffix`) and llama.cpp's lookup decoding; the index here is a plain n-gram -> occurrences map over token ids.

A row's tree merges the continuations of the most recent occurrences of its longest matching suffix into a trie;
a node's confidence is the share of those continuations that pass through it. Nodes below `min_prob` are dropped,
and a short match drafts shallowly (at most `spec_factor` x the match length), as a 1-token match says little."""
from collections import defaultdict

from ..tree import from_nodes
from .base import Drafter


class SuffixIndex:
    """Token sequences by key, and for every n-gram (n <= max_n) of each that something followed, where it ended.

    An n-gram is indexed when the token after it arrives, not when it ends: rows of a batch that share their text
    (a job's items on one template, or one prompt sampled many times) all end in the same n-grams, and had those ends
    been indexed, every lookup would step over one empty occurrence per row before the useful ones, O(rows) per row
    and round (one call of 6,000 such rows ran 64 s, six calls of 1,000 8.5 s)."""

    def __init__(self, max_n=8):
        self.max_n = max_n
        self.seqs = {}
        self.where = defaultdict(list)  # n-gram tuple -> [(sequence key, position after it)], oldest first

    def extend(self, key, tokens):
        seq = self.seqs.setdefault(key, [])
        for t in tokens:
            end = len(seq)  # the n-grams ending here get their first continuation token, t
            for n in range(1, min(self.max_n, end) + 1):
                self.where[tuple(seq[end - n:])].append((key, end))
            seq.append(t)

    def continuations(self, context, depth, limit):
        """The longest suffix of `context` (at most max_n tokens) seen before with something after it: (its length,
        up to `limit` continuations of at most `depth` tokens, most recent first); (0, []) when none."""
        for n in range(min(self.max_n, len(context)), 0, -1):
            found = []
            for key, end in reversed(self.where.get(tuple(context[-n:]), ())):
                found.append(self.seqs[key][end: end + depth])
                if len(found) == limit:
                    break
            if found:
                return n, found
        return 0, []


def trie_nodes(continuations, k, budget, min_prob):
    """Merge token lists into a trie and keep its most shared nodes: at most `budget`, at most k children per node,
    each on at least min_prob of the lists. Returns [(parent, token)] with node i + 1 = pair i, parents first, and
    each node's share of the lists (its draft score: the share of recent occurrences that continued this way)."""
    total = len(continuations)
    count, parent, token, level, kids = [total], [-1], [None], [0], [{}]
    for cont in continuations:
        node = 0
        for t in cont:
            if t not in kids[node]:
                kids[node][t] = len(count)
                count.append(0), parent.append(node), token.append(t), level.append(level[node] + 1), kids.append({})
            node = kids[node][t]
            count[node] += 1
    # Most shared first; a parent is on every list its children are on, and ties go to the shallower node, so a
    # parent is always considered before its children.
    order = sorted(range(1, len(count)), key=lambda i: (-count[i], level[i], i))
    kept, children = {0: 0}, defaultdict(int)
    for i in order:
        if len(kept) > budget or count[i] < min_prob * total:
            break
        p = parent[i]
        if p in kept and children[p] < k:
            children[p] += 1
            kept[i] = None
    chosen = sorted((i for i in kept if i), key=lambda i: (level[i], i))
    for n, i in enumerate(chosen, 1):
        kept[i] = n
    return [(kept[parent[i]], token[i]) for i in chosen], [count[i] / total for i in chosen]


class SuffixDrafter(Drafter):
    max_n = 8           # longest suffix matched
    occurrences = 16    # most recent occurrences merged per row
    spec_factor = 2     # draft depth <= spec_factor x match length

    def __init__(self, target, head, configured, min_match=1, min_prob=0.1):
        super().__init__(target, head, configured)
        self.min_match, self.min_prob = min_match, min_prob
        self.index = SuffixIndex(self.max_n)

    def join(self, batch, feats, lens):
        if not self.index.seqs:  # the first prompts: index the references first, so the call's own text is newer
            for i, ref in enumerate(batch.references):
                self.index.extend(("reference", i), ref)
        for row in range(batch.size - len(lens), batch.size):
            self.index.extend(batch.rows.live[row], batch.context(row))

    def observe(self, batch, tree, acc, feats, emitted):
        for slot in batch.rows.live:  # the tokens emitted since the row's last sync (finished rows included)
            done = len(self.index.seqs[slot]) - len(batch.prompts[slot])
            self.index.extend(slot, batch.rows.tokens[slot][done:])

    def draft(self, slot, k, depth, budget):
        """One row's draft nodes and their scores (see trie_nodes)."""
        n, conts = self.index.continuations(self.index.seqs[slot], depth, self.occurrences)
        if n < self.min_match:
            return [], []
        conts = [c[: self.spec_factor * n] for c in conts]
        return trie_nodes(conts, k, budget, self.min_prob)

    def propose(self, batch, shape):
        k, depth, total = shape
        nodes, scores = zip(*(self.draft(slot, k, depth, total - 1) for slot in batch.rows.live))
        return from_nodes(batch.root, nodes, scores)

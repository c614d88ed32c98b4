"""The drafter interface. A drafter proposes a draft tree per live row each round; the target verifies all rows'
trees in one forward and the decoder commits what it accepted, then tells the drafter (observe) so it can extend
its own state. One drafter instance serves one generate() call, so it may keep per-call state (caches, indexes).

Hooks, in the order the decoding loop calls them:
  join(batch, feats, lens)  prompts were prefilled into new rows at the batch's end (target features [m, T, F])
  retire(keep)              finished rows left: row j is now old row keep[j]
  prepare(batch)            before a tree round only: one-off catch-up work (not part of the round's measured cost)
  propose(batch, shape)     the round's trees (shape: the policy's (parallel_degree, depth, total_tokens) limits)
  observe(batch, tree, acc, feats, emitted)  after commit: the verified tree (root-only for a plain step), what was
                            accepted, the target's features at every node and the emitted tokens per row
Trees must stay within shape's depth (the KV caches leave room for that many levels past a row's end)."""
from ..tree import Tree


class Drafter:
    def __init__(self, target, head, configured):
        """target, the decoder's head (drafters that do not use it ignore it), and configured: the decoder's largest
        (parallel_degree, depth, total_tokens)."""
        self.target, self.head, self.configured = target, head, configured

    def join(self, batch, feats, lens):
        pass

    def retire(self, keep):
        pass

    def prepare(self, batch):
        pass

    def propose(self, batch, shape) -> Tree:
        raise NotImplementedError

    def observe(self, batch, tree, acc, feats, emitted):
        pass

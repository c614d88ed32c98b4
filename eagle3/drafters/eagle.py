"""The EAGLE-3 head as a drafter: it reads (target features, next token) pairs into its own KV cache and grows the
dynamic tree (eagle3/tree.py) from its output at each row's last pair."""
import torch

from ..tree import draft_tree
from .base import Drafter

CATCH_UP = 96  # most (features, token) pairs per row the head reads before a tree (a prompt's ~50 fit)


class EagleDrafter(Drafter):
    def __init__(self, target, head, configured):
        super().__init__(target, head, configured)
        self.embed = target.model.embed_tokens
        self.cache = self.root_out = None
        # Per live row, the (features, next token) pairs the head has not read yet: its prompt after it joins, then
        # the plain steps since its last tree. The head reads them just before the next tree (prepare), so
        # plain-step-only batches never pay for the head.
        self.unread = []

    def join(self, batch, feats, lens):
        head, m = self.head, len(lens)
        k, depth, _ = self.configured
        # Room for a tree past a row's end, and for the padding of a catch-up over other rows' prompts
        new = head.new_cache(m, 2 * batch.cache.max_len + depth * k + depth + 2)
        self.cache = new if self.cache is None else self.cache.extend(new)
        out0 = torch.zeros(m, head.config.hidden_size, dtype=self.embed.weight.dtype, device=feats.device)
        self.root_out = out0 if self.root_out is None else torch.cat([self.root_out, out0])
        first, dev = batch.root[-m:], feats.device
        for i, n in enumerate(lens.tolist()):
            prompt = torch.tensor(batch.prompts[batch.rows.live[i - m]][1:], dtype=torch.long, device=dev)
            self.unread.append([(feats[i, :n], torch.cat([prompt, first[i: i + 1]]))])

    def retire(self, keep):
        self.cache.keep(keep)
        self.root_out = self.root_out[torch.tensor(keep, dtype=torch.long, device=self.root_out.device)]
        self.unread = [self.unread[i] for i in keep]

    def prepare(self, batch):
        if any(self.unread):
            self.root_out = self._catch_up()
            self.unread = [[] for _ in self.unread]

    def propose(self, batch, shape):
        return draft_tree(self.head, self.embed, batch.root, self.root_out, self.cache, *shape)

    def observe(self, batch, tree, acc, feats, emitted):
        if tree.size == 1:  # a plain step: read it before the next tree
            for i in range(batch.size):
                self.unread[i].append((feats[i, :1], emitted[i, :1]))
            return
        # The emitted tokens pair with the target features of the path's nodes to extend the head's context
        # (pair j = (features of path[j], emitted[j])).
        head, n, dev = self.head, batch.size, emitted.device
        pf = feats.gather(1, acc.path[..., None].expand(-1, -1, feats.shape[-1]))
        ar = torch.arange(emitted.shape[1], device=dev)
        mask = (ar[None, :, None] >= ar[None, None, :]) & (ar < acc.length[:, None])[:, None, :] | (ar[:, None] == ar)
        out = head(self.embed(emitted), head.project(pf), self.cache.lens[:, None] + ar, self.cache, mask)
        self.root_out = out[torch.arange(n, device=dev), acc.length - 1]
        self.cache.lens += acc.length

    def _catch_up(self):
        """Run the head over each row's unread (features, next token) pairs, padded to the longest row; returns its
        output at each row's last pair (rows with none keep root_out), which drafts the next tree."""
        unread, hcache, root_out = self.unread, self.cache, self.root_out
        n, dev = len(unread), hcache.lens.device
        # The last CATCH_UP pairs only: after a long run of plain steps (the budget found trees do not pay) the head
        # reading all of them would make every probe cost several plain steps; the target's features at the recent
        # positions carry the older context, and a draft never changes the output, only its speed.
        feats = [torch.cat([f for f, _ in u])[-CATCH_UP:] if u else None for u in unread]
        toks = [torch.cat([t for _, t in u])[-CATCH_UP:] if u else None for u in unread]
        counts = [0 if t is None else len(t) for t in toks]
        P, ref = max(counts), next(f for f in feats if f is not None)
        feat = torch.zeros(n, P, ref.shape[-1], dtype=ref.dtype, device=dev)
        tok = torch.zeros(n, P, dtype=torch.long, device=dev)
        for i, c in enumerate(counts):
            if c:
                feat[i, :c], tok[i, :c] = feats[i], toks[i]
        c = torch.tensor(counts, device=dev)
        ar = torch.arange(P, device=dev)
        mask = (ar[:, None] >= ar[None, :]) & (ar < c[:, None])[:, None, :] | torch.eye(P, dtype=torch.bool, device=dev)
        out = self.head(self.embed(tok), self.head.project(feat), hcache.lens[:, None] + ar, hcache, mask)
        hcache.lens += c
        last = out[torch.arange(n, device=dev), (c - 1).clamp(min=0)]
        return torch.where((c > 0)[:, None], last, root_out)

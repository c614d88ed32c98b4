"""The live batch of one generate() call: which prompt each batch row decodes, the target's KV cache and each row's
root, plus the per-prompt outputs and counters. The decoding loop asks it to retire finished rows, admit waiting
prompts (prefill) and commit a verified round; drafters read it (rows, prompts, outputs) but never change it."""
import time

import torch

from .target import pad_prompts


class Rows:
    """Per-prompt outputs and counters of one generate call; `live` maps batch rows to prompt slots. Prompts join
    in slot order as rows free up (admit)."""

    def __init__(self, limits, eos):
        n = len(limits)
        self.tokens = [[] for _ in range(n)]
        self.finish = [None] * n
        self.limits, self.eos = limits, set(eos)
        self.forwards, self.rounds, self.accepted = [1] * n, [0] * n, [0] * n
        self.start, self.wall = [0.0] * n, [0.0] * n
        self.live, self.next = [], 0
        self.on_tokens = None  # optional callback(slot, tokens): the tokens each emit appended (streaming)

    @property
    def waiting(self):
        return self.next < len(self.limits)

    def admit(self, room, elapsed):
        """The next `room` waiting slots join the batch (at its end); returns them."""
        slots = list(range(self.next, min(self.next + room, len(self.limits))))
        self.next += len(slots)
        self.live += slots
        for s in slots:
            self.start[s] = elapsed
        return slots

    def emit(self, slot, toks):
        if self.on_tokens is None:
            self._append(slot, toks)
            return
        before = len(self.tokens[slot])
        self._append(slot, toks)
        if len(self.tokens[slot]) > before:
            self.on_tokens(slot, self.tokens[slot][before:])

    def _append(self, slot, toks):
        for t in toks:
            if t in self.eos:
                self.finish[slot] = "stop"
                return
            self.tokens[slot].append(t)
            if len(self.tokens[slot]) >= self.limits[slot]:
                self.finish[slot] = "length"
                return

    def retire(self, elapsed):
        """Drop finished rows; returns the new batch order as indices into the old one (None when nothing changed).
        Live rows from the end fill the finished rows' places, so the KV caches move only those rows (KVCache.keep)."""
        done = [self.finish[s] is not None for s in self.live]
        for i, s in enumerate(self.live):
            if done[i]:
                self.wall[s] = elapsed - self.start[s]
        n = done.count(False)
        if n == len(self.live):
            return None
        movers = iter(i for i in range(n, len(done)) if not done[i])
        keep = [next(movers) if done[i] else i for i in range(n)]
        self.live = [self.live[i] for i in keep]
        return keep


class LiveBatch:
    """The rows decoded together. `root` [rows]: each row's last emitted token, not yet in the target's cache: the
    next round's tree (or plain step) starts from it. `references`: token lists the drafters may draft from (a
    job's earlier outputs)."""

    def __init__(self, model, prompts, limits, eos, batch_size, cap, references=()):
        self.model, self.prompts, self.batch_size, self.cap = model, prompts, batch_size, cap
        self.references = list(references)
        self.rows = Rows(limits, eos)
        self.cache = self.root = None
        self.t0 = time.perf_counter()

    @property
    def size(self):
        return len(self.rows.live)

    def elapsed(self):
        return time.perf_counter() - self.t0

    def context(self, row):
        """Row's prompt and output so far (its root last)."""
        slot = self.rows.live[row]
        return self.prompts[slot] + self.rows.tokens[slot]

    def retire(self):
        """Drop finished rows (see Rows.retire); returns the new order as indices into the old one, or None."""
        keep = self.rows.retire(self.elapsed())
        if keep is not None:
            self.cache.keep(keep)
            self.root = self.root[torch.tensor(keep, dtype=torch.long, device=self.root.device)]
        return keep

    def admit(self, pick):
        """Prefill the next waiting prompts into the free rows, appended at the batch's end; `pick` chooses their
        first tokens from the logits. None when no prompt waits or no row is free, else the prefill's features
        [m, T, F] with the prompts' lengths [m] (a drafter may read them)."""
        if not self.rows.waiting or self.size >= self.batch_size:
            return None
        slots = self.rows.admit(self.batch_size - self.size, self.elapsed())
        tokens, lens, pos, causal = pad_prompts([self.prompts[s] for s in slots], self.model.embed_tokens.weight.device)
        new = self.model.new_cache(len(slots), self.cap)
        logits, feats = self.model(tokens, pos, new, causal, logits_at=(lens - 1)[:, None])
        new.lens.copy_(lens)
        first = pick(logits[:, 0])
        self.cache = new if self.cache is None else self.cache.extend(new)
        self.root = first if self.root is None else torch.cat([self.root, first])
        for s, t in zip(slots, first.tolist()):
            self.rows.emit(s, [t])
        return feats, lens

    def commit(self, tree, acc):
        """Keep the accepted path's K/V, make the bonus token the new root and emit path + bonus per row. Returns the
        emitted tokens [rows, depth + 1] (row i's first acc.length[i] count)."""
        if tree.size == 1:  # a plain step: its one slot is already in place
            self.cache.lens += 1
        else:
            self.cache.commit(acc.path, acc.length)
        path_tok = tree.tokens.gather(1, acc.path)
        emitted = torch.cat([path_tok[:, 1:], acc.bonus[:, None]], 1)
        emitted.scatter_(1, (acc.length - 1)[:, None], acc.bonus[:, None])
        self.root = acc.bonus
        rows = self.rows
        for s, toks, n in zip(rows.live, emitted.tolist(), acc.length.tolist()):
            rows.forwards[s] += 1
            rows.rounds[s] += 1
            rows.accepted[s] += n
            rows.emit(s, toks[:n])
        return emitted

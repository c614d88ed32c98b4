"""The decoding loop: prefill, then rounds of draft tree -> one target forward over the tree -> accept -> commit.

`SpeculativeDecoder.generate(..., speculative=False)` runs plain autoregressive decoding through the very same
target forward and KV cache, so measured speedups compare like with like."""
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .adopt import as_target
from .draft import Eagle3Head, HeadConfig
from .policy import PLAIN, SpeculationPolicy
from .target import Target, pad_prompts
from .tree import draft_tree
from .verify import verify_greedy, verify_sampling, warp

MODELS_DIR = Path(__file__).resolve().parent.parent / "models"


@dataclass
class GenerationResult:
    text: str
    token_ids: list
    finish_reason: str  # "stop" (end of turn token) or "length"
    stats: dict = field(default_factory=dict)


def _require(ok, field, msg):
    if not ok:
        raise ValueError(f"{field}: {msg}")


def default_head_path(target: Target) -> Path:
    return MODELS_DIR / f"eagle3-{target.name}"


def resolve_head(target: Target, draft) -> Eagle3Head:
    """draft: an Eagle3Head, a checkpoint directory, or None (the shipped head for this target, else untrained)."""
    if draft is None:
        path = default_head_path(target)
        if (path / "config.json").exists():
            draft = path
        else:
            draft = Eagle3Head.random(HeadConfig.for_target(target.config))
    if isinstance(draft, (str, Path)):
        draft = Eagle3Head.from_pretrained(draft)
    _require(isinstance(draft, Eagle3Head), "draft", "expected an Eagle3Head, a checkpoint directory or None")
    c, tc = draft.config, target.config
    _require(c.vocab_size == tc.vocab_size and c.target_hidden_size == tc.hidden_size, "draft",
             f"head (vocab {c.vocab_size}, target hidden {c.target_hidden_size}) does not fit the target "
             f"(vocab {tc.vocab_size}, hidden {tc.hidden_size})")
    w = target.model.embed_tokens.weight
    return draft.to(device=w.device, dtype=w.dtype).eval().pack()


class _Rows:
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


class SpeculativeDecoder:
    """EAGLE-3 speculative decoding over a target model.

    target / model (either name): a Target (load_target), a model directory or name as load_target takes, or a
        transformers Llama / Qwen2 / Mistral model (`AutoModelForCausalLM.from_pretrained(...)`), whose weights the
        engine takes over in the model's own dtype, so greedy output equals its generate(do_sample=False); its
        tokenizer comes from the model's name_or_path directory, or pass `tokenizer=` (eagle3/adopt.py).
        Other architectures and types are a ValueError.
    draft: an Eagle3Head, a checkpoint directory, or None: the head shipped for this target under
        models/eagle3-<name>/, else an untrained head (still lossless at threshold 1.0, just with few accepted
        tokens, so slow).
    parallel_degree: children kept per tree node (top-k). Larger trees accept more tokens per round but make each
        verify forward and draft step dearer; on a CPU small trees win.
    depth: tree levels drafted per round (the most tokens one round can accept, plus the target's bonus token).
    total_tokens: tree nodes verified per round, root included.
    adaptive: pick each round's tree, or a plain decode step, by measured throughput at the current batch size
        (eagle3/policy.py): every row's tree adds to the verify forward, so what pays at batch 1 can lose at batch 8.
        The tree never grows past the configured one. False: always use the configured tree.
    validation_threshold: 1.0 (default) is strict, lossless verification. Below 1.0 a drafted token is also accepted
        when the target gives it at least threshold x its top probability: more tokens per forward (faster), but
        the output is no longer exactly the target's — a fidelity/speed trade-off, off by default.
    """

    def __init__(self, target=None, draft=None, parallel_degree=4, validation_threshold=1.0, depth=5,
                 total_tokens=16, adaptive=True, *, model=None, tokenizer=None):
        _require(isinstance(parallel_degree, int) and parallel_degree >= 1, "parallel_degree", "must be an integer >= 1")
        _require(isinstance(validation_threshold, (int, float)) and 0 < validation_threshold <= 1,
                 "validation_threshold", "must be in (0, 1]")
        _require(isinstance(depth, int) and depth >= 1, "depth", "must be an integer >= 1")
        _require(isinstance(total_tokens, int) and total_tokens >= 2, "total_tokens", "must be an integer >= 2")
        _require((target is None) != (model is None), "model", "pass one model (as target or model), not none or both")
        self.target = as_target(target if model is None else model, tokenizer, "target" if model is None else "model")
        self.model = self.target.model
        self.head = resolve_head(self.target, draft)
        self.k, self.threshold, self.depth, self.total_tokens = parallel_degree, float(validation_threshold), depth, total_tokens
        self.policy = SpeculationPolicy((parallel_degree, depth, total_tokens)) if adaptive else None
        self.last_stats = {}

    # ------------------------------------------------------------ public API

    def generate(self, prompts, max_new_tokens=128, temperature=0.0, top_p=1.0, top_k=0, batch_size=8,
                 speculative=True, seed=None):
        """Decode each prompt (chat template applied) and return one GenerationResult per prompt, in order."""
        _require(isinstance(prompts, (list, tuple)) and len(prompts) > 0, "prompts", "must be a non-empty list")
        ids = []
        for i, p in enumerate(prompts):
            _require(isinstance(p, str) and p.strip() != "", f"prompts[{i}]", "must be a non-empty string")
            ids.append(self.target.encode_prompt(p))
        return self.generate_ids(ids, max_new_tokens, temperature, top_p, top_k, batch_size, speculative, seed)

    def generate_ids(self, ids, max_new_tokens=128, temperature=0.0, top_p=1.0, top_k=0, batch_size=8,
                     speculative=True, seed=None):
        """Like generate(), from already-tokenised prompts (lists of token ids, no template added)."""
        _require(isinstance(ids, (list, tuple)) and len(ids) > 0, "prompts", "must be a non-empty list")
        _require(isinstance(max_new_tokens, int) and max_new_tokens >= 1, "max_new_tokens", "must be an integer >= 1")
        _require(isinstance(temperature, (int, float)) and temperature >= 0, "temperature", "must be >= 0")
        _require(isinstance(top_p, (int, float)) and 0 < top_p <= 1, "top_p", "must be in (0, 1]")
        _require(isinstance(top_k, int) and top_k >= 0, "top_k", "must be an integer >= 0")
        _require(isinstance(batch_size, int) and batch_size >= 1, "batch_size", "must be an integer >= 1")
        room = self.target.max_context - self.depth - 2  # keep space for one tree past the last token
        limits = []
        for i, x in enumerate(ids):
            _require(len(x) > 0, f"prompts[{i}]", "is empty")
            _require(len(x) < room, f"prompts[{i}]", f"is {len(x)} tokens; the model's context is {self.target.max_context}")
            limits.append(min(max_new_tokens, room - len(x)))
        gen = None
        if seed is not None:
            gen = torch.Generator(device=self.target.device).manual_seed(seed)
        sampling = dict(temperature=float(temperature), top_p=float(top_p), top_k=top_k, generator=gen)
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))  # similar lengths together: less padding
        results = [None] * len(ids)
        totals = dict(new_tokens=0, target_forwards=0, rounds=0, accepted=0, draft_time_s=0.0, verify_time_s=0.0,
                      wall_time_s=0.0, accept_hist=[0] * (self.depth + 1), plain_steps=0)
        out = self._decode([list(ids[i]) for i in order], [limits[i] for i in order], batch_size, speculative,
                           sampling, totals)
        for i, r in zip(order, out):
            results[i] = r
        totals["accept_length"] = totals["accepted"] / totals["rounds"] if totals["rounds"] else 1.0
        totals["tokens_per_s"] = totals["new_tokens"] / totals["wall_time_s"] if totals["wall_time_s"] else 0.0
        totals["speculative"] = speculative
        totals.pop("accepted")
        self.last_stats = totals
        return results

    @torch.no_grad()
    def score_options(self, prompt, options):
        """Log-probability of each option (a string) as the start of the assistant's reply to `prompt`. One prefill,
        then all options in one forward as independent branches (a tree) over the prompt's cache."""
        _require(isinstance(prompt, str) and prompt.strip() != "", "prompt", "must be a non-empty string")
        _require(isinstance(options, (list, tuple)) and len(options) > 0 and all(isinstance(o, str) and o for o in options),
                 "options", "must be a non-empty list of non-empty strings")
        dev = self.target.device
        p = self.target.encode_prompt(prompt)
        opts = [self.target.tokenizer.encode(o) for o in options]
        _require(len(p) + max(map(len, opts)) < self.target.max_context, "prompt", "is longer than the model's context")
        cache = self.model.new_cache(1, len(p) + sum(map(len, opts)) + 1)
        T = len(p)
        last, _ = self.model(torch.tensor([p], device=dev), torch.arange(T, device=dev)[None], cache,
                             torch.ones(T, T, dtype=torch.bool, device=dev).tril()[None], logits_at=torch.tensor([[T - 1]], device=dev))
        cache.lens[:] = T
        flat = [t for o in opts for t in o]
        M = len(flat)
        tm = torch.zeros(M, M, dtype=torch.bool, device=dev)
        pos, start = [], 0
        for o in opts:
            tm[start: start + len(o), start: start + len(o)] = torch.ones(len(o), len(o), dtype=torch.bool).tril()
            pos += [T + j for j in range(len(o))]
            start += len(o)
        logits, _ = self.model(torch.tensor([flat], device=dev), torch.tensor([pos], device=dev), cache, tm[None])
        lp_first = torch.log_softmax(last[0, 0].float(), -1)
        lp = torch.log_softmax(logits[0].float(), -1)
        scores, start = [], 0
        for o in opts:
            s = float(lp_first[o[0]]) + sum(float(lp[start + j - 1, o[j]]) for j in range(1, len(o)))
            scores.append(s)
            start += len(o)
        return scores

    # ------------------------------------------------------------ the loop

    def _pick(self, logits, sampling):
        if sampling["temperature"] == 0:
            return logits.argmax(-1)
        probs = warp(logits, sampling["temperature"], sampling["top_k"], sampling["top_p"])
        return torch.multinomial(probs.view(-1, probs.shape[-1]), 1, generator=sampling["generator"]).view(probs.shape[:-1])

    @torch.no_grad()
    def _decode(self, ids, limits, batch_size, speculative, sampling, totals):
        """Decode all prompts, at most batch_size rows at a time. A finished row's place goes to the next waiting
        prompt (continuous batching): speculative rows finish at different rounds, and a batch left to run on with a
        few stragglers would pay most of a full round for each of their tokens."""
        t0 = time.perf_counter()
        rows = _Rows(limits, self.target.eos_ids)
        cap = max(map(len, ids)) + max(limits) + self.depth + self.total_tokens + 2
        admit = lambda cache: self._admit(ids, rows, cache, cap, batch_size, sampling, t0)  # noqa: E731
        if speculative:
            self._speculative_rounds(admit, rows, sampling, totals, t0)
        else:
            self._vanilla_steps(admit, rows, sampling, t0)
        wall = time.perf_counter() - t0
        out = []
        for s in range(len(ids)):
            n = len(rows.tokens[s])
            st = dict(new_tokens=n, target_forwards=rows.forwards[s], rounds=rows.rounds[s],
                      accept_length=rows.accepted[s] / rows.rounds[s] if rows.rounds[s] else 1.0,
                      wall_time_s=rows.wall[s] or wall, speculative=speculative)
            st["tokens_per_s"] = n / st["wall_time_s"] if st["wall_time_s"] else 0.0
            out.append(GenerationResult(self.target.decode(rows.tokens[s]), rows.tokens[s], rows.finish[s] or "length", st))
            totals["new_tokens"] += n
            totals["rounds"] += rows.rounds[s]
            totals["accepted"] += rows.accepted[s]
            totals["target_forwards"] += rows.forwards[s]
        totals["wall_time_s"] += wall
        return out

    def _admit(self, ids, rows, cache, cap, batch_size, sampling, t0):
        """Prefill the next waiting prompts into the free rows, appended to `cache` (a new cache when None). None when
        no prompt waits or no row is free, else (cache, their first tokens [m], their prompt pairs for the head: per
        row (features [L, F], the tokens that follow [L]), the last pair taking the first token)."""
        if not rows.waiting or len(rows.live) >= batch_size:
            return None
        slots = rows.admit(batch_size - len(rows.live), time.perf_counter() - t0)
        dev = self.target.device
        tokens, lens, pos, causal = pad_prompts([ids[s] for s in slots], dev)
        new = self.model.new_cache(len(slots), cap)
        logits, feats = self.model(tokens, pos, new, causal, logits_at=(lens - 1)[:, None])
        new.lens.copy_(lens)
        first = self._pick(logits[:, 0], sampling)
        pairs = []
        for i, s in enumerate(slots):
            L = len(ids[s])
            pairs.append((feats[i, :L], torch.cat([tokens[i, 1:L], first[i: i + 1]])))
            rows.emit(s, [int(first[i])])
        return (new if cache is None else cache.extend(new)), first, pairs

    def _vanilla_steps(self, admit, rows, sampling, t0):
        one = torch.ones(1, 1, 1, dtype=torch.bool, device=self.target.device)
        cache = tok = None
        while True:
            keep = rows.retire(time.perf_counter() - t0)
            if keep is not None:
                cache.keep(keep)
                tok = tok[keep]
            new = admit(cache)
            if new:
                cache, first, _ = new
                tok = first if tok is None else torch.cat([tok, first])
                continue  # a new row may be done at its first token
            if not rows.live:
                return
            logits, _ = self.model(tok[:, None], cache.lens[:, None], cache, one.expand(len(tok), 1, 1))
            cache.lens += 1
            tok = self._pick(logits[:, 0], sampling)
            for i, s in enumerate(rows.live):
                rows.forwards[s] += 1
                rows.emit(s, [int(tok[i])])

    def _speculative_rounds(self, admit, rows, sampling, totals, t0):
        head, embed = self.head, self.model.embed_tokens
        greedy = sampling["temperature"] == 0
        cache = hcache = root = root_out = None
        # Per live row, the (features, next token) pairs the head has not read yet: its prompt after it joins, then
        # the plain steps since its last tree. The head reads them just before the next tree, so plain-step-only
        # batches never pay for the head.
        unread = []
        while True:
            keep = rows.retire(time.perf_counter() - t0)
            if keep is not None:
                cache.keep(keep)
                hcache.keep(keep)
                idx = torch.tensor(keep, dtype=torch.long, device=root.device)
                root, root_out = root[idx], root_out[idx]
                unread = [unread[i] for i in keep]
            new = admit(cache)
            if new:
                cache, first, pairs = new
                m = len(first)
                # Room for a tree past a row's end, and for the padding of a catch-up over other rows' prompts
                hnew = head.new_cache(m, 2 * cache.max_len + self.depth * self.k + self.depth + 2)
                hcache = hnew if hcache is None else hcache.extend(hnew)
                out0 = torch.zeros(m, head.config.hidden_size, dtype=embed.weight.dtype, device=first.device)
                root = first if root is None else torch.cat([root, first])
                root_out = out0 if root_out is None else torch.cat([root_out, out0])
                unread += [[p] for p in pairs]
                continue  # a new row may be done at its first token
            if not rows.live:
                return
            n = len(root)
            shape = self.policy.choose(n, greedy) if self.policy else (self.k, self.depth, self.total_tokens)
            td = time.perf_counter()
            if shape is PLAIN:  # one ordinary step; the head catches up on it before the next tree
                logits, feats = self.model(root[:, None], cache.lens[:, None], cache,
                                           torch.ones(n, 1, 1, dtype=torch.bool, device=root.device))
                cache.lens += 1
                nxt = self._pick(logits[:, 0], sampling)
                for i in range(n):
                    unread[i].append((feats[i, :1], nxt[i: i + 1]))
                root = nxt
                step_s = time.perf_counter() - td
                totals["verify_time_s"] += step_s
                totals["plain_steps"] += n
                self.policy.observe(PLAIN, n, greedy, step_s, 1.0)
                nx = nxt.tolist()
                for i, s in enumerate(rows.live):
                    rows.forwards[s] += 1
                    rows.rounds[s] += 1
                    rows.accepted[s] += 1
                    rows.emit(s, [nx[i]])
                continue
            # Reading the unread pairs is a one-off cost of joining or switching, so it counts as draft time but not
            # in the tree's round time the policy measures.
            if any(unread):
                root_out = self._catch_up(hcache, unread, root_out)
                unread = [[] for _ in range(n)]
            tc = time.perf_counter()
            switch_s = tc - td
            totals["draft_time_s"] += switch_s
            td = tc
            tree = draft_tree(head, embed, root, root_out, hcache, *shape)
            tv = time.perf_counter()
            logits, feats = self.model(tree.tokens, cache.lens[:, None] + tree.depth, cache, tree.mask)
            if greedy:
                acc = verify_greedy(tree, logits, self.threshold)
            else:
                probs = warp(logits, sampling["temperature"], sampling["top_k"], sampling["top_p"])
                acc = verify_sampling(tree, probs, self.threshold, sampling["generator"])
            cache.commit(acc.path, acc.length)
            tu = time.perf_counter()
            # Emitted tokens: the accepted drafts, then the bonus token. They pair with the target features of the
            # path's nodes to extend the head's context (pair j = (features of path[j], emitted[j])).
            path_tok = tree.tokens.gather(1, acc.path)
            emitted = torch.cat([path_tok[:, 1:], acc.bonus[:, None]], 1)
            emitted.scatter_(1, (acc.length - 1)[:, None], acc.bonus[:, None])
            pf = feats.gather(1, acc.path[..., None].expand(-1, -1, feats.shape[-1]))
            ar = torch.arange(emitted.shape[1], device=root.device)
            hm = (ar[None, :, None] >= ar[None, None, :]) & (ar < acc.length[:, None])[:, None, :] | (ar[:, None] == ar)
            out = head(embed(emitted), head.fc(pf), hcache.lens[:, None] + ar, hcache, hm)
            root_out = out[torch.arange(n, device=root.device), acc.length - 1]
            hcache.lens += acc.length
            root = acc.bonus
            te = time.perf_counter()
            totals["draft_time_s"] += (tv - td) + (te - tu)
            totals["verify_time_s"] += tu - tv
            em, ln = emitted.tolist(), acc.length.tolist()
            if self.policy:
                self.policy.observe(shape, n, greedy, te - td, sum(ln) / n, switch_s)
            for i, s in enumerate(rows.live):
                rows.forwards[s] += 1
                rows.rounds[s] += 1
                rows.accepted[s] += ln[i]
                totals["accept_hist"][ln[i] - 1] += 1  # rounds that emitted ln tokens
                rows.emit(s, em[i][: ln[i]])

    def _catch_up(self, hcache, unread, root_out):
        """Run the head over each row's unread (features, next token) pairs, padded to the longest row; returns its
        output at each row's last pair (rows with none keep root_out), which drafts the next tree."""
        n, dev = len(unread), hcache.lens.device
        feats = [torch.cat([f for f, _ in u]) if u else None for u in unread]
        toks = [torch.cat([t for _, t in u]) if u else None for u in unread]
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
        out = self.head(self.model.embed_tokens(tok), self.head.fc(feat), hcache.lens[:, None] + ar, hcache, mask)
        hcache.lens += c
        last = out[torch.arange(n, device=dev), (c - 1).clamp(min=0)]
        return torch.where((c > 0)[:, None], last, root_out)

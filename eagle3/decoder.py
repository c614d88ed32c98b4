"""The decoding loop: prefill, then rounds of propose (a drafter's tree per row, eagle3/drafters) -> verify (one
target forward over every row's tree) -> accept -> commit (KV cache, outputs; the drafter observes what was accepted).

`SpeculativeDecoder.generate(..., speculative=False)` runs plain autoregressive decoding through the very same
target forward and KV cache, so measured speedups compare like with like."""
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from . import compiled, hardware, heads
from .adopt import as_target
from .batch import LiveBatch
from .draft import Eagle3Head, HeadConfig
from .drafters import DRAFTERS
from .layers import Linear, few_rows, has_int8, int8_linears, own_kernel, row_chunks
from .quant import quantize_q4
from .budget import PLAIN, DraftBudget, unpadded
from .profile import load_or_measure
from .target import Target
from .tree import root_only
from .verify import Accepted, greedy, verify_greedy, verify_sampling, warp



def _is_chat(p):
    """A non-empty prompt string or a non-empty list of {role, content} messages with string contents."""
    if isinstance(p, str):
        return p.strip() != ""
    return isinstance(p, (list, tuple)) and len(p) > 0 and all(
        isinstance(m, dict) and m.get("role") in ("system", "user", "assistant") and isinstance(m.get("content"), str)
        for m in p)


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
    """The head directory of this target: the shipped head (version 0) and its adapted versions (eagle3/heads.py)."""
    return heads.head_root(target.name)


def head_of_version(target: Target, version: int) -> Eagle3Head:
    """A version of this target's head (eagle3/heads.py) in float32. Version 0 of a target shipped without a head is
    the untrained head (always the same seed)."""
    path = heads.version_dir(default_head_path(target), version)
    if heads.has_weights(path):
        return Eagle3Head.from_pretrained(path)
    _require(version == 0, "draft", f"no head version {version} in {path}")
    return Eagle3Head.random(HeadConfig.for_target(target.config))


def resolve_head(target: Target, draft) -> Eagle3Head:
    """draft: an Eagle3Head, a checkpoint directory, or None (the current version of this target's head)."""
    if draft is None:
        draft = head_of_version(target, heads.current_version(default_head_path(target)))
    if isinstance(draft, (str, Path)):
        draft = Eagle3Head.from_pretrained(draft)
    _require(isinstance(draft, Eagle3Head), "draft", "expected an Eagle3Head, a checkpoint directory or None")
    c, tc = draft.config, target.config
    _require(c.vocab_size == tc.vocab_size and c.target_hidden_size == tc.hidden_size, "draft",
             f"head (vocab {c.vocab_size}, target hidden {c.target_hidden_size}) does not fit the target "
             f"(vocab {tc.vocab_size}, hidden {tc.hidden_size})")
    w = target.model.embed_tokens.weight
    # A copy: the caller's head keeps its weights and dtype (Module.to casts in place, and a packed or quantised
    # head cannot be copied back)
    fresh = Eagle3Head(draft.config)
    fresh.load_state_dict(draft.state_dict())
    draft = fresh.to(device=w.device, dtype=w.dtype).eval()
    if has_int8(target.model):  # the head follows the target's format
        return int8_linears(draft.pack())
    if own_kernel(target.model):  # Q4_1 linears through the engine's kernel (eagle3/amx.py, eagle3/vnni.py), on a
        # CPU: each draft step reads the head's ~10M weights from memory (the target's forward evicted them from
        # cache). Q4_1 reads about half of Q8_0's bytes, and drafting only proposes, so the output stays the target's.
        for m in draft.modules():
            if isinstance(m, Linear) and m.own_kernel_takes():
                quantize_q4(m)
    return draft.pack()


class SpeculativeDecoder:
    """EAGLE-3 speculative decoding over a target model.

    target / model (either name): a Target (load_target), a model directory or name as load_target takes, or a
        transformers Llama / Qwen2 / Mistral model (`AutoModelForCausalLM.from_pretrained(...)`), whose weights the
        engine takes over in the model's own dtype, so greedy output equals its generate(do_sample=False); its
        tokenizer comes from the model's name_or_path directory, or pass `tokenizer=` (eagle3/adopt.py).
        Other architectures and types are a ValueError.
    draft: an Eagle3Head, a checkpoint directory, or None: the current version of this target's head under
        models/eagle3-<name>/ (the shipped head unless `python -m eagle3.adapt` installed another; eagle3/heads.py),
        else an untrained head (still lossless at threshold 1.0, just with few accepted tokens, so slow).
    parallel_degree: children kept per tree node (top-k). Larger trees accept more tokens per round but make each
        verify forward and draft step dearer; on a CPU small trees win.
    depth: tree levels drafted per round (the most tokens one round can accept, plus the target's bonus token).
    total_tokens: tree nodes verified per round, root included.
    adaptive: a draft budget per round (eagle3/budget.py): how deep to draft, and how many of each row's surest
        nodes to verify — or a plain decode step — priced by this device's cost curve (eagle3/profile.py, measured
        once per machine and cached) against calibrated acceptance: every row's tree adds to the verify forward, so
        what pays at batch 1 can lose at batch 8. The tree never grows past the configured one. False: always verify
        the configured tree.
    validation_threshold: 1.0 (default) is strict, lossless verification. Below 1.0 a drafted token is also accepted
        when the target gives it at least threshold x its top probability: more tokens per forward (faster), but
        the output is no longer exactly the target's — a fidelity/speed trade-off, off by default.
    drafter: who proposes the trees (eagle3/drafters): "eagle" (the head), "suffix" (continuations of text the
        prompts and outputs of this call already contain; no model), "hybrid" (the head's tree plus confident suffix
        matches).
    """

    def __init__(self, target=None, draft=None, parallel_degree=4, validation_threshold=1.0, depth=5,
                 total_tokens=16, adaptive=True, *, model=None, tokenizer=None, drafter="eagle"):
        _require(isinstance(parallel_degree, int) and parallel_degree >= 1, "parallel_degree", "must be an integer >= 1")
        _require(isinstance(validation_threshold, (int, float)) and 0 < validation_threshold <= 1,
                 "validation_threshold", "must be in (0, 1]")
        _require(isinstance(depth, int) and depth >= 1, "depth", "must be an integer >= 1")
        _require(isinstance(total_tokens, int) and total_tokens >= 2, "total_tokens", "must be an integer >= 2")
        _require(drafter in DRAFTERS, "drafter", f"must be one of {', '.join(DRAFTERS)}")
        _require((target is None) != (model is None), "model", "pass one model (as target or model), not none or both")
        self.target = as_target(target if model is None else model, tokenizer, "target" if model is None else "model")
        self.model = self.target.model
        self.head = resolve_head(self.target, draft)
        self.k, self.threshold, self.depth, self.total_tokens = parallel_degree, float(validation_threshold), depth, total_tokens
        self.configured, self.drafter = (parallel_degree, depth, total_tokens), drafter
        self.budget = DraftBudget(self.configured) if adaptive else None
        self.row_chunk = hardware.row_chunk(self.model)
        self.few_rows = hardware.few_rows_until(self.model)
        self.compiled = compiled.available(self.model)
        self.last_stats = {}

    # ------------------------------------------------------------ public API

    def generate(self, prompts, max_new_tokens=128, temperature=0.0, top_p=1.0, top_k=0, batch_size=8,
                 speculative=True, seed=None, references=()):
        """Decode each prompt (a string, or a chat as a list of {role, content} messages; chat template applied)
        and return one GenerationResult per prompt, in order. references: texts the suffix and hybrid drafters may
        draft from besides this call's prompts and outputs (a bulk job's earlier outputs); they never change the
        output, only how fast it comes."""
        _require(isinstance(prompts, (list, tuple)) and len(prompts) > 0, "prompts", "must be a non-empty list")
        ids = []
        for i, p in enumerate(prompts):
            _require(_is_chat(p), f"prompts[{i}]", "must be a non-empty string or a list of {role, content} messages")
            ids.append(self.target.encode_prompt(p))
        _require(isinstance(references, (list, tuple)) and all(isinstance(r, str) for r in references), "references",
                 "must be a list of strings")
        refs = [self.target.tokenizer.encode(r) for r in references]
        return self.generate_ids(ids, max_new_tokens, temperature, top_p, top_k, batch_size, speculative, seed, refs)

    def generate_ids(self, ids, max_new_tokens=128, temperature=0.0, top_p=1.0, top_k=0, batch_size=8,
                     speculative=True, seed=None, references=(), on_tokens=None):
        """Like generate(), from already-tokenised prompts and references (lists of token ids, no template added).
        on_tokens: optional callback(i, tokens), called as prompt i's output grows by `tokens` (streaming); its
        calls for one prompt concatenate to that prompt's token_ids."""
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
        slot_cb = None if on_tokens is None else (lambda slot, toks: on_tokens(order[slot], toks))
        out = self._decode([list(ids[i]) for i in order], [limits[i] for i in order], batch_size, speculative,
                           sampling, totals, [list(r) for r in references], slot_cb)
        for i, r in zip(order, out):
            results[i] = r
        totals["accept_length"] = totals["accepted"] / totals["rounds"] if totals["rounds"] else 1.0
        totals["tokens_per_s"] = totals["new_tokens"] / totals["wall_time_s"] if totals["wall_time_s"] else 0.0
        totals["speculative"] = speculative
        totals.pop("accepted")
        self.last_stats = totals
        return results

    def warm_up(self, batch_size=1):
        """Compile now what calls at this batch size (and at batch 1, where a batch's last rows end) will run, rather
        than inside the first calls that need it: the compiled steps of every tree size (eagle3/compiled.py) and this
        device's cost profile (eagle3/profile.py). A no-op where neither applies or both are cached."""
        self._load_profile()
        if self.compiled:
            drafts = self.drafter != "suffix"  # the suffix drafter has no head
            for call in sorted({1, batch_size}):
                if self._chunk(call) is not None:  # calls in row chunks run eager steps
                    continue
                # The kernel calls of this size run (hardware.few_rows_until), whose graphs are its own, at their
                # batch size and at batch 1, where their last rows end.
                with few_rows(call <= self.few_rows):
                    for rows in sorted({1, call}):
                        compiled.warm(self.model, rows, self.total_tokens)
                        if drafts:
                            self.head.warm(rows)

    def _load_profile(self):
        if self.budget and self.budget.profile is None:
            self.budget.profile = load_or_measure(self.target)  # cached per machine: seconds, once

    def _chunk(self, rows):
        """Rows per dense GEMM call (layers.row_chunks) for a call decoding `rows` rows at a time, or None."""
        return self.row_chunk if rows >= hardware.ROW_CHUNK_FROM else None

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
            return greedy(logits)
        probs = warp(logits, sampling["temperature"], sampling["top_k"], sampling["top_p"])
        return torch.multinomial(probs.view(-1, probs.shape[-1]), 1, generator=sampling["generator"]).view(probs.shape[:-1])

    @torch.no_grad()
    def _decode(self, ids, limits, batch_size, speculative, sampling, totals, references=(), on_tokens=None):
        """Decode all prompts, at most batch_size rows at a time. A finished row's place goes to the next waiting
        prompt (continuous batching): speculative rows finish at different rounds, and a batch left to run on with a
        few stragglers would pay most of a full round for each of their tokens."""
        cap = max(map(len, ids)) + max(limits) + self.depth + self.total_tokens + 2
        batch = LiveBatch(self.model, ids, limits, self.target.eos_ids, batch_size, cap, references)
        batch.rows.on_tokens = on_tokens
        pick = lambda logits: self._pick(logits, sampling)  # noqa: E731
        # Large batches run the target's int4 layers as dense GEMMs in fixed row chunks where the device has them
        # (hardware.row_chunk), prefills included: chosen per call from its batch size, so a speculative call and its
        # vanilla twin compute alike.
        # Decode and verify forwards run compiled (eagle3/compiled.py) unless the call uses row chunks.
        # Calls of few rows run the VNNI kernel where Linears have both of the engine's (hardware.few_rows_until).
        rows = min(batch_size, len(ids))
        chunk = self._chunk(rows)
        steps_on = self.compiled and chunk is None
        if self.budget:  # a tree costs what its compiled bucket does
            self.budget.padded = compiled.bucket if steps_on else unpadded
        with row_chunks(chunk), few_rows(rows <= self.few_rows), compiled.compiled_steps(steps_on):
            if speculative:
                drafter = DRAFTERS[self.drafter](self.target, self.head, self.configured)
                self._speculative_rounds(batch, drafter, pick, sampling, totals)
            else:
                self._vanilla_steps(batch, pick)
        wall = batch.elapsed()
        rows, out = batch.rows, []
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

    def _vanilla_steps(self, batch, pick):
        one = torch.ones(1, 1, 1, dtype=torch.bool, device=self.target.device)
        rows = batch.rows
        while True:
            batch.retire()
            if batch.admit(pick) is not None:
                continue  # a new row may be done at its first token
            if not rows.live:
                return
            cache = batch.cache
            logits, _ = self.model(batch.root[:, None], cache.lens[:, None], cache, one.expand(batch.size, 1, 1))
            cache.lens += 1
            batch.root = pick(logits[:, 0])
            for s, tok in zip(rows.live, batch.root.tolist()):  # one host copy, not one per row
                rows.forwards[s] += 1
                rows.emit(s, [tok])

    def _speculative_rounds(self, batch, drafter, pick, sampling, totals):
        self._load_profile()
        while True:
            keep = batch.retire()
            if keep is not None:
                drafter.retire(keep)
            joined = batch.admit(pick)
            if joined is not None:
                drafter.join(batch, *joined)
                continue  # a new row may be done at its first token
            if not batch.size:
                return
            self._round(batch, drafter, sampling, totals)

    def _propose(self, batch, drafter, shape, greedy):
        """The round's trees: the drafter's, trimmed to the budget; root-only (a plain step) for PLAIN."""
        if shape is PLAIN:
            return root_only(batch.root)
        tree = drafter.propose(batch, shape)
        return self.budget.trim(tree, greedy) if self.budget else tree

    def _round(self, batch, drafter, sampling, totals):
        """One round over every live row: propose -> verify -> accept -> commit."""
        greedy = sampling["temperature"] == 0
        shape = self.budget.plan(batch.size, greedy) if self.budget else self.configured
        t0 = time.perf_counter()
        if shape is not PLAIN:  # the drafter's catch-up on skipped plain steps: a one-off, not what a round costs
            drafter.prepare(batch)
        t1 = time.perf_counter()
        tree = self._propose(batch, drafter, shape, greedy)
        t2 = time.perf_counter()
        logits, feats = self.model(tree.tokens, batch.cache.lens[:, None] + tree.depth, batch.cache, tree.mask)
        acc = self._accept(tree, logits, sampling)
        emitted = batch.commit(tree, acc)
        t3 = time.perf_counter()
        drafter.observe(batch, tree, acc, feats, emitted)
        t4 = time.perf_counter()
        self._count(totals, tree, acc, t2 - t0 + t4 - t3, t3 - t2)
        if self.budget:
            self.budget.observe(shape, tree, acc, greedy, t3 - t2, t2 - t1 + t4 - t3, t4 - t1, t1 - t0)

    def _count(self, totals, tree, acc, draft_s, verify_s):
        totals["draft_time_s"] += draft_s
        totals["verify_time_s"] += verify_s
        if tree.size == 1:
            totals["plain_steps"] += len(tree.tokens)
        else:
            for ln in acc.length.tolist():
                totals["accept_hist"][ln - 1] += 1  # rounds that emitted ln tokens

    def _accept(self, tree, logits, sampling):
        """The accepted path and bonus token per row; a plain step picks as vanilla decoding does."""
        if tree.size == 1:
            zeros = torch.zeros_like(tree.tokens)
            return Accepted(zeros, zeros[:, 0] + 1, self._pick(logits[:, 0], sampling))
        if sampling["temperature"] == 0:
            return verify_greedy(tree, logits, self.threshold)
        probs = warp(logits, sampling["temperature"], sampling["top_k"], sampling["top_p"])
        return verify_sampling(tree, probs, self.threshold, sampling["generator"])

"""The draft budget: each round, how deep to draft and how many tree nodes to verify per row — from none (a plain
decode step) up to the drafter's whole tree — priced with the device's cost curve (eagle3/profile.py), not trials.

Why: the verify forward's cost grows with rows x nodes (on a CPU nearly in proportion once past a few dozen tokens,
bench/results/profile.md), while a drafted node is worth only its chance of being accepted. A node pays when its
expected tokens beat what its share of the forward would have bought as plain steps, and at batch 8-32 only the
surest nodes do. Every round:

  1. plan(rows):  before drafting, pick the draft depth with the best expected rate, or PLAIN (no draft, a plain
     step). Expected tokens come from the running average of recent rounds' gain curves (g[d][n]: expected tokens
     a row gets from its n surest nodes no deeper than d); costs from the profile, scaled by measured / profiled
     seconds, plus the drafter's measured seconds per round at that depth. A plain step gives rows / t(rows, 1).
  2. trim(tree):  every node's score (its cumulative draft probability) is calibrated against measured acceptance
     (per depth and score bin) and capped by its parent's (a node is accepted only with its parent). The round
     verifies the N - 1 surest nodes of each row, N maximising (rows + expected accepted) / t(rows, N); rows pad to
     the longest, so N is one number for the batch. N = 1 turns the round into a plain step.
  3. observe(...): which verified nodes were accepted updates the calibration; seconds update the cost scales and
     the drafter's cost (without its catch-up on skipped plain steps: a one-off that plain rounds cause, which
     would otherwise make every probe after a run of plain steps look too dear to draft again).

While plain steps win, the gain curves are not refreshed, so a tree of the best depth is drafted again after
`explore` plain rounds (16, doubling up to 1024 while plain keeps winning): at most a few per cent of the rounds.

Last, measurements overrule the estimates, which are wrong often enough to lose (costs the profile misses, gain
curves that lag: on the AMX Xeon at batch 1 the plan took plain steps and depth-5 probes whose drafting cost 15 ms,
while depth-2 trees measured 1.2x vanilla). Per bucket of row counts (1, 2, 3-4, 5-8, ...), every arm — plain steps
and each depth — keeps the measured speed of its whole rounds (drafting, verify, accept, commit: every second a round
costs but the drafter's catch-up on the plain steps before it, which is what switching arms costs, not what the arm
does: counted in, it fell on every probe of a tree after plain steps, and on a 2-core AVX-512 EPYC depth-2 trees then
measured 0.89x plain steps while, drafted every round, they ran 1.09x vanilla; the budget stayed on plain steps at
0.94x vanilla. Probes are spaced by it instead), as tokens per second relative to the profile's plain step at the
round's row count, so that the counts of a bucket compare: a batch whose rows finish one by one measures its arms
once, not again at 7, 6 and 5 rows, where each probe of a losing tree costs throughput (on the AVX512 EPYC trees lose
by ~1/3 at batch 8). Once the model's choice and plain steps are measured, plan takes the best measured arm, after
trying each neighbour of it (one level shallower or deeper, plain below depth 1) for `samples` rows' worth of rounds
(at least 2), and re-measures the stalest neighbour or the model's choice, as many rounds, after `refresh` rounds, then
after twice as many while the best arm stays the best, and never so soon that such probes take more than PROBE_SHARE
of the time (up to `max_explore`): the model picks where to start, measurements pick where to stay.
"""
import numpy as np
import torch

from .tree import prune

PLAIN = None  # no draft this round: one ordinary decode step for every row
MODEL = "model"  # _measured_arm: the model decides (its choice is not measured yet)
BINS = 10     # calibration bins over the draft score in [0, 1]
PROBE_SHARE = 0.03  # most share of a bucket's time that re-measuring a losing arm may take


def unpadded(nodes: int) -> int:
    """Eager steps compute the nodes they are given (DraftBudget.padded)."""
    return nodes


def bucket(rows: int) -> int:
    """1 -> 0, 2 -> 1, 3-4 -> 2, 5-8 -> 3, 9-16 -> 4, ... (draft seconds are kept per bucket)"""
    return (rows - 1).bit_length()


def fewest_rows(b: int) -> int:
    """The smallest row count of bucket b: 1, 2, 3, 5, 9, ..."""
    return 2 ** (b - 1) + 1 if b else 1


class Calibration:
    """P(accepted | depth, score bin), by counting verified nodes. A bin with few counts leans on `prior`
    pseudo-nodes at the raw score scaled by how the drafter's scores held up at that depth so far (accepted / sum of
    scores, over every bin): a head whose scores run low (0.35 where 0.75 are accepted) is believed after a handful of
    nodes, not after every bin has filled — at batch 1 the budget drafts only where it expects to win, so a budget
    that trusted low raw scores would take plain steps and rarely see the nodes that would correct it."""

    def __init__(self, depth, prior=4.0):
        self.hits = np.zeros((depth + 1, BINS))
        self.seen = np.zeros((depth + 1, BINS))
        self.scored = np.zeros(depth + 1)  # sum of the raw scores of the counted nodes, per depth
        self.prior = prior

    def _bins(self, score, depth):
        return np.minimum(depth, len(self.hits) - 1), np.minimum((score * BINS).astype(int), BINS - 1)

    def __call__(self, score, depth):
        d, b = self._bins(score, depth)
        scale = (self.hits.sum(1) + self.prior) / (self.scored + self.prior)  # 1 until nodes are counted
        raw = np.minimum(score * scale[d], 1.0)
        return (self.hits[d, b] + self.prior * raw) / (self.seen[d, b] + self.prior)

    def add(self, score, depth, accepted):
        d, b = self._bins(score, depth)
        np.add.at(self.hits, (d, b), accepted)
        np.add.at(self.seen, (d, b), 1)
        np.add.at(self.scored, d, score)


def tree_arrays(tree):
    """The tree as numpy arrays on the host: valid, score, depth, mask ([B, N], [B, N], [B, N], [B, N, N]); a tree
    without validity or scores counts every node valid and sure."""
    shape = tree.tokens.shape
    valid = np.ones(shape, bool) if tree.valid is None else tree.valid.cpu().numpy()
    score = np.ones(shape) if tree.score is None else tree.score.double().cpu().numpy()
    return valid, score, tree.depth.cpu().numpy(), tree.mask.cpu().numpy()


def surest(score, valid, mask):
    """Per node, the calibrated chance it is accepted: its own, capped by every ancestor's (numpy [B, N]; root 1,
    padding 0)."""
    p = np.where(valid, score, 0.0)
    p[:, 0] = 1.0
    return np.where(mask, p[:, None, :], 1.0).min(-1)


class DraftBudget:
    def __init__(self, configured, profile=None, alpha=0.1, first_explore=16, max_explore=1024, samples=8,
                 refresh=32):
        self.k, self.depth, self.total = configured
        self.profile, self.alpha = profile, alpha
        self.first_explore, self.max_explore = first_explore, max_explore
        self.calibration = {g: Calibration(self.depth) for g in (True, False)}
        self.gain = {}         # greedy -> [depth + 1, total] running g[d][n]
        self.gain_trees = {}   # greedy -> trees the gain curves have learnt from
        self.draft_s = {}      # (bucket, depth) -> running seconds of the drafter per round
        self.warm, self.draft_alpha = set(), 0.3
        # Measured / profiled verify seconds: `level` from every round (the machine may be busier or quieter than
        # when it was profiled), `tree_extra` from tree rounds on top of it (their accept and commit cost more).
        self.level, self.tree_extra = 1.0, 1.0
        self.waits = {}        # bucket -> [plain rounds since the last tree, plain rounds allowed before a probe]
        self.used = {}         # (bucket, depth or PLAIN) -> rounds, for summaries
        self.trees = 0         # rounds that drafted because it paid
        # bucket -> running (measured tokens/s of tree rounds) / (what plan predicted for them): the estimates'
        # own error (calibration lag, costs the profile misses), which would otherwise draft where it loses.
        self.realism, self.predicted = {}, None
        # Nodes a verify forward of n nodes per row really computes: compiled steps pad a forward's new tokens up to
        # a bucket (eagle3/compiled.py), so 5 nodes cost what 8 do, and the best tree fills its bucket. The decoder
        # sets it per call (identity where a call runs eager steps).
        self.padded = unpadded
        self._memo = {}
        # Measured arms: row-count bucket -> {PLAIN or depth: [speed of whole rounds relative to the profile's plain
        # step, rounds, round last measured, running profiled plain seconds of the tokens and seconds of a round]}.
        self.measured, self.samples, self.refresh, self.clock = {}, samples, refresh, {}
        self.refreshed = {}  # bucket -> (round of the last re-measurement, rounds until the next, the best arm then)
        self.catch_up = {}   # bucket -> running seconds of the drafter's catch-up before a tree after plain steps
        self.probing = {}    # bucket -> (arm being re-measured, rounds of it still to run)
        self.fresh = {}      # (bucket, arm) -> rounds since its re-measurement began: they average evenly at first
        self.after_plain = False
        self.choice = {}     # (rows, greedy) -> the model's last choice (PLAIN or a depth)

    # ------------------------------------------------------------ costs

    def cost(self, rows, nodes):
        """Expected seconds of the verify forward (with accept and commit) for `nodes` nodes per row."""
        return self._profiled(rows, nodes) * self.level * (self.tree_extra if nodes > 1 else 1.0)

    def _profiled(self, rows, nodes):
        # Memoised: plan() prices every depth x node count each round, and the interpolation in Python cost ~3 ms a
        # round at batch 1 (10% of a step on a 2-core CPU). The profile and `padded` are fixed within a call.
        key = (id(self.profile), self.padded, rows, nodes)
        if key not in self._memo:
            self._memo[key] = self.profile.cost(rows, self.padded(nodes))
        return self._memo[key]

    def drafting(self, rows, d):
        """Expected seconds the drafter spends per round at depth d: measured at this batch size, else scaled from
        another depth measured at this batch size (a level costs about as much as the first), else 0: unknown, so
        the first round at a new batch size drafts and measures it."""
        b = bucket(rows)
        if (b, d) in self.draft_s:
            return self.draft_s[(b, d)]
        near = [(dd, s) for (bb, dd), s in self.draft_s.items() if bb == b]
        return min((s * (d + 1) / (dd + 1) for dd, s in near), default=0.0)

    def best_nodes(self, rows, curve, extra_s=0.0):
        """(rate, N) best for a batch whose rows expect curve[n] tokens from their n surest nodes."""
        rates = [(rows * (1 + curve[n - 2]) / (self.cost(rows, n) + extra_s), n) for n in range(2, len(curve) + 2)]
        return max(rates, default=(0.0, 1))

    # ------------------------------------------------------------ the round

    def can_pay(self, rows, d):
        """Whether drafting depth d could beat plain steps at all: at best d + 1 tokens a row (every level accepted)
        for a verify of d + 1 nodes (a chain, the cheapest tree that deep) and the drafting, against d + 1 plain
        steps. Where a forward's cost grows with every token it holds, no tree can: on a 2-core AVX2-only EPYC t(32,
        2) = 2.4 t(32, 1) (eagle3/profile.py), and while the budget measured and re-measured trees there, EAGLE-3
        ran batch 32 at 0.84x vanilla (bench.peers, 2026-12-07, a noisy VM)."""
        return (d + 1) * self.cost(rows, 1) > self.cost(rows, d + 1) + self.drafting(rows, d)

    def plan(self, rows, greedy):
        """The depth to draft this round, as the drafter's shape (parallel_degree, depth, total_tokens), or PLAIN."""
        if not any(self.can_pay(rows, d) for d in range(1, self.depth + 1)):
            return self._use(rows, PLAIN)  # no tree can win here: never draft, measure or probe one
        if greedy not in self.gain:
            return self._use(rows, self.depth)  # nothing measured yet: draft the whole tree once
        b = bucket(rows)
        self.clock[b] = self.clock.get(b, 0) + 1
        if (rows, greedy) in self.choice:  # measurements first: the model's sums cost ~0.5 ms, 4% of a step
            arm = self._measured_arm(rows, self.choice[(rows, greedy)])
            if arm != MODEL:
                return self._use(rows, arm)
        plain = rows / self.cost(rows, 1)
        gain = np.maximum.accumulate(self.gain[greedy], 0)  # a deeper draft holds the shallower one's nodes
        rate, d = max((self.best_nodes(rows, gain[d], self.drafting(rows, d))[0], d) for d in range(1, self.depth + 1))
        self.predicted = rate
        rate *= self.realism.get(b, 1.0)
        self.choice[(rows, greedy)] = d if rate > plain else PLAIN
        arm = self._measured_arm(rows, self.choice[(rows, greedy)])
        if arm != MODEL:
            return self._use(rows, arm)
        since, wait = self.waits.setdefault(b, [0, self.first_explore])
        if rate > plain:
            self.waits[b] = [0, self.first_explore]
            self.trees += 1
            # Curves of depths never drafted go stale: now and then draft one level deeper than the best.
            return self._use(rows, min(d + 1, self.depth) if self.trees % self.first_explore == 0 else d)
        if since + 1 >= wait:  # plain keeps winning: look again, later each time, at the best depth (a probe of
            self.waits[b] = [0, min(2 * wait, self.max_explore)]  # the whole tree cost ~10 plain steps at batch 32)
            return self._use(rows, d)
        self.waits[b][0] += 1
        return self._use(rows, PLAIN)

    def _measured_arm(self, rows, choice):
        """The arm (PLAIN or a depth) measurements pick at this row count's bucket, or MODEL while the model's `choice`
        is unmeasured."""
        b = bucket(rows)
        m, now = self.measured.get(b, {}), self.clock[b]
        # Enough rounds to trust an arm's speed: `samples` rows' worth, at least 2 (a round of many rows averages
        # their accepted lengths already, and each probe of a losing tree at batch 32 costs several plain rounds).
        enough = max(2, -(-self.samples // fewest_rows(b)))
        if m.get(choice, [0, 0])[1] < enough:
            return MODEL
        if m.get(PLAIN, [0, 0])[1] < enough:  # plain steps are the yardstick: measure them too
            return PLAIN
        arm, left = self.probing.get(b, (None, 0))
        if left:  # a re-measurement runs `enough` rounds in a row
            self.probing[b] = (arm, left - 1)
            return arm
        best = max(m, key=lambda a: m[a][0] if m[a][1] >= enough else -1.0)
        arms = [PLAIN, *(d for d in range(1, self.depth + 1) if d == best or self.can_pay(rows, d))]
        i = arms.index(best)
        near = arms[max(i - 1, 0): i + 2]
        for a in near:  # a neighbour not yet measured enough
            if m.get(a, [0, 0])[1] < enough:
                return a
        # Re-measure the stalest neighbour (or the model's choice) now and then, less often each time while the best
        # arm stays the best: the landscape moves with the context and the prompts, and the machine's own speed with
        # its load (a 2-core VM ran plain steps 35% faster one minute than the one before, so a tree measured in the
        # slow minute looked slower than plain steps measured since). The re-measurement runs `enough` rounds and
        # replaces the arm's speed rather than nudging it, so the arms it compares were measured minutes apart at most.
        last, wait, kept = self.refreshed.get(b, (0, self.refresh, best))
        if kept != best:
            wait = self.refresh
        others = [a for a in {*near, choice} if a != best and (a is PLAIN or self.can_pay(rows, a))]
        if others and now - last >= wait:
            stale = min(others, key=lambda a: m[a][2])
            # The next look waits twice as long, and long enough that probes like this one (a losing tree with
            # the head's catch-up costs several plain rounds at batch 32) stay a PROBE_SHARE of the time.
            switch = self.catch_up.get(b, 0.0) if best is PLAIN else 0.0  # a tree after plain steps catches up first
            probe = (enough * m[stale][4] + switch) / max(m[best][4], 1e-9)
            self.refreshed[b] = (now, min(max(2 * wait, round(probe / PROBE_SHARE)), self.max_explore), best)
            self.probing[b], self.fresh[(b, stale)] = (stale, enough - 1), 0
            return stale
        self.refreshed[b] = (last, wait, best)
        return best

    def _use(self, rows, d):
        self.used[(bucket(rows), d)] = self.used.get((bucket(rows), d), 0) + 1
        return PLAIN if d is PLAIN else (self.k, d, self.total)

    def trim(self, tree, greedy):
        """Keep each row's N - 1 surest nodes, N chosen by expected rate (N = 1: a plain step)."""
        rows = len(tree.tokens)
        valid, score, depth, mask = tree_arrays(tree)
        p = surest(self.calibration[greedy](score, depth), valid, mask)
        self._learn_gain(p, depth, greedy)
        order = np.argsort(-(p[:, 1:] - 1e-6 * depth[:, 1:]), axis=1, kind="stable") + 1  # parents first on ties
        curve = np.cumsum(np.take_along_axis(p, order, 1), 1).mean(0)
        rate, n = self.best_nodes(rows, curve)
        if rate <= rows / self.cost(rows, 1):
            n = 1
        keep = np.sort(np.concatenate([np.zeros((rows, 1), int), order[:, : n - 1]], 1), 1)
        return prune(tree, torch.from_numpy(keep).to(tree.tokens.device))

    def _learn_gain(self, p, depth, greedy):
        """Update g[d][n] for every depth this tree reaches (deeper ones keep their estimate)."""
        gain = self.gain.setdefault(greedy, np.zeros((self.depth + 1, self.total - 1)))
        # A plain mean over the first trees (the first one taken as it is), then a running average: the first curves
        # come from a calibration with hardly any counts, and where plain steps win trees are rare, so at alpha alone they would linger.
        self.gain_trees[greedy] = n = self.gain_trees.get(greedy, 0) + 1
        alpha = max(self.alpha, 1.0 / n)
        for d in range(1, min(int(depth.max()), self.depth) + 1):
            q = np.sort(np.where(depth[:, 1:] <= d, p[:, 1:], 0.0), 1)[:, ::-1]
            curve = np.zeros(self.total - 1)
            c = np.cumsum(q, 1).mean(0)[: self.total - 1]
            curve[: len(c)] = c
            curve[len(c):] = c[-1] if len(c) else 0.0
            gain[d] += alpha * (curve - gain[d])

    def observe(self, shape, tree, acc, greedy, verify_s, draft_s, round_s=None, catch_up_s=0.0):
        """One round's outcome: acceptance of the verified nodes, the verify and draft seconds, the whole round's
        seconds (round_s: drafting, verify, accept and commit) for the measured arms, and the seconds the drafter
        spent catching up on plain steps before it (catch_up_s: what a probe of a tree costs on top)."""
        rows, n = len(tree.tokens), tree.size
        if shape is not PLAIN and self.after_plain:  # this tree's drafter caught up on the plain steps before it
            old = self.catch_up.get(bucket(rows), catch_up_s)
            self.catch_up[bucket(rows)] = old + self.alpha * (catch_up_s - old)
        self.after_plain = shape is PLAIN
        ratio = verify_s / max(self._profiled(rows, n), 1e-9)
        shape_key = ("verify", rows, self.padded(n))
        if shape_key not in self.warm:  # a forward shape's first run may compile its graphs: not a sample
            self.warm.add(shape_key)
        else:
            self._measure(rows, shape, float(acc.length.sum()), round_s)
            if n > 1:
                self.tree_extra += self.alpha * (ratio / self.level - self.tree_extra)
            else:
                self.level += self.alpha * (ratio - self.level)
        if shape is PLAIN:
            return
        if n > 1 and tree.score is not None:
            self._calibrate(tree, acc, greedy)
        if self.predicted:  # how the plan's estimate held up, verify and drafting included
            real = float(acc.length.sum()) / max(verify_s + draft_s, 1e-9) / self.predicted
            old = self.realism.get(bucket(rows), 1.0)
            self.realism[bucket(rows)] = old + self.alpha * (real - old)
            self.predicted = None
        key = (bucket(rows), shape[1])
        if key not in self.warm:  # a shape's first round pays one-off kernel set-up: not a sample
            self.warm.add(key)
            return
        old = self.draft_s.get(key, draft_s)
        self.draft_s[key] = old + self.draft_alpha * (draft_s - old)

    def _measure(self, rows, shape, tokens, round_s, alpha=0.1):
        """The arm's speed in whole rounds, relative to the profile's plain step at this row count (1.0 = as fast as
        the profile says a plain step is; measured seconds run above it by the machine's load): running tokens over
        running seconds (a round's own rate swings 3x with its accepted length; their ratio does not). Kept per
        bucket of row counts, so a batch whose rows finish one by one (8, 7, 6, 5 rows) measures once rather than
        at every count. A drafted round counts for its depth even where trim left a plain step: it paid for the
        drafting."""
        if not round_s:
            return
        arm = PLAIN if shape is PLAIN else shape[1]
        b = bucket(rows)
        m = self.measured.setdefault(b, {})
        plain_s = self._profiled(rows, 1) / rows  # profiled seconds per token of a plain step at this row count
        rate, n, _, tok, sec = m.get(arm, [0.0, 0, 0, tokens * plain_s, round_s])
        if (b, arm) in self.fresh:  # re-measured: its k-th round counts 1/k, older rounds fade out
            k = self.fresh[(b, arm)] = self.fresh[(b, arm)] + 1
            if k * alpha >= 1:  # from here on the running average's own weight
                del self.fresh[(b, arm)]
            alpha = max(alpha, 1.0 / k)
        tok, sec = tok + alpha * (tokens * plain_s - tok), sec + alpha * (round_s - sec)
        m[arm] = [tok / sec, n + 1, self.clock.get(b, 0), tok, sec]

    def _calibrate(self, tree, acc, greedy):
        valid, score, depth, _ = tree_arrays(tree)
        path, length = acc.path.cpu().numpy(), acc.length.cpu().numpy()
        accepted = np.zeros(tree.tokens.shape, bool)
        on_path = np.arange(path.shape[1])[None, :] < length[:, None]
        np.put_along_axis(accepted, np.where(on_path, path, 0), True, 1)  # the padding past a path marks the root
        drafted = valid & (np.arange(valid.shape[1]) > 0)  # not the root (and not valid itself: it may be the tree's)
        self.calibration[greedy].add(score[drafted], depth[drafted], accepted[drafted])

    def summary(self):
        """{batch-size bucket: {depth or "plain": share of rounds}}, for logs and benchmarks."""
        out = {}
        for (b, d), n in sorted(self.used.items(), key=lambda x: (x[0][0], -1 if x[0][1] is None else x[0][1])):
            label = f"{fewest_rows(b)}-{2 ** b}" if b > 1 else str(fewest_rows(b))
            out.setdefault(label, {})["plain" if d is None else f"depth {d}"] = n
        for label, counts in out.items():
            total = sum(counts.values())
            out[label] = {k: round(v / total, 3) for k, v in counts.items()}
        return out

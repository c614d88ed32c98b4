"""Adaptive speculation: pick each round's draft tree — or no tree at all — from measured throughput.

Whether a tree pays depends on the device, the weight format and how many rows share the verify forward: with fp32
weights on a CPU a 16-node tree at batch 1 is nearly free (bench/results/engine.md), with bf16 + int4 a 3-node tree is
what pays, and at batch 8 eight trees can cost more than they save. So the policy measures instead of guessing. For every candidate (a plain step, or one of a few tree shapes no larger than
the configured one) it keeps
  - tau: tokens emitted per row per round (moving average; shared by all batch sizes, since acceptance depends on
    the head and the text, not on the batch), per greedy/sampled mode, and
  - seconds per round and row, per batch-size bucket (1, 2, 3-4, 5-8, ... rows): per row, because rows retire
    and a bucket spans up to 2x the rows, so a candidate measured at 17 rows must not look cheaper than one
    measured at 32 (on a CPU a large batch's round costs about in proportion to its rows),
and each round picks the candidate with the most expected tokens per second: tau / seconds. A plain step is tau = 1
by definition, so speculation is only used where it measured faster than not speculating.

Measuring costs: at batch 32 one 16-node tree round costs ~12 plain steps on a CPU, so the policy explores frugally:
  - trees are measured cheapest first, and a larger one only once the smaller one came within `margin` of the best
    so far (trees cost more per round the larger they are; if three nodes already lose clearly, sixteen do too);
  - a tree that cannot win even if every draft were accepted (depth + 1 tokens per round) is never tried again in
    that bucket;
  - the stalest remaining candidate is re-measured after `explore_every` rounds, and the wait doubles (up to
    `max_explore_every`) each time the best stays the same, so a settled bucket pays almost nothing;
  - and re-measurements never take more than `budget` of a bucket's time, counting what a switch costs besides
    the round (the head reading the prompt or the plain steps it missed: at batch 32 about two plain steps).
"""
from dataclasses import dataclass, field

PLAIN = None  # the "no tree" candidate: one ordinary decode step
SMALL_SHAPES = ((2, 2, 3), (2, 4, 6))  # (parallel_degree, depth, total_tokens), cheapest first


def bucket(rows: int) -> int:
    """1 -> 0, 2 -> 1, 3-4 -> 2, 5-8 -> 3, 9-16 -> 4, ..."""
    return (rows - 1).bit_length()


@dataclass
class _Stat:
    value: float = 0.0
    n: int = 0
    last_round: int = 0
    warm: bool = False

    def add(self, x, alpha, now, skip_first=False):
        self.last_round = now
        if skip_first and not self.warm:  # the first round of a new shape pays one-off kernel set-up: not a sample
            self.warm = True
            return
        self.n += 1
        self.value += max(alpha, 1 / self.n) * (x - self.value)  # a plain mean until it has 1/alpha samples


@dataclass
class SpeculationPolicy:
    configured: tuple                   # the decoder's (parallel_degree, depth, total_tokens)
    alpha: float = 0.2                  # weight of the newest sample in the moving average of round seconds
    # ... and of tau. One round emits anywhere from 1 to depth + 1 tokens, so a 5-round average (0.2) let two
    # unlucky rounds make a paying tree look worse than a plain step, which then held for up to 2048 rounds: at batch 1
    # it took plain steps (0.99x vanilla) where a 3-node tree gives 1.21x. A ~20-round average (0.05) keeps it.
    tau_alpha: float = 0.05
    explore_every: int = 64             # rounds per bucket before the first re-measurement
    max_explore_every: int = 2048       # ... doubling up to this while the best stays the same
    margin: float = 0.9                 # try the next larger tree if this one reached margin x the best rate
    budget: float = 0.03                # most of a bucket's time that re-measurements may take
    tau: dict = field(default_factory=dict)      # (shape, greedy) -> _Stat
    seconds: dict = field(default_factory=dict)  # (shape, bucket) -> _Stat of seconds per round and row
    rounds: dict = field(default_factory=dict)   # bucket -> rounds decided
    explore: dict = field(default_factory=dict)  # bucket -> [round of the next re-measurement, wait, best then]
    spent: dict = field(default_factory=dict)    # bucket -> [seconds observed, of which re-measurements]
    probe: dict = field(default_factory=dict)    # bucket -> the candidate being re-measured this round

    @property
    def candidates(self):
        k, d, n = self.configured
        small = [s for s in SMALL_SHAPES if s[0] <= k and s[1] <= d and s[2] <= n]
        return [PLAIN, *dict.fromkeys(small + [self.configured])]

    def _measured(self, c, b):
        return self.seconds.get((c, b), _Stat()).n >= 2  # two samples after the discarded first one

    def live(self, b: int, greedy: bool) -> list:
        """The candidates still worth measuring or using in bucket b, cheapest first; it ends at the first one not
        yet measured."""
        out = [PLAIN]
        if not self._measured(PLAIN, b):
            return out
        plain = best = self.expected_rate(PLAIN, b, greedy)
        for c in self.candidates[1:]:
            if not self._measured(c, b):
                return out + [c]
            rate = self.expected_rate(c, b, greedy)
            if (c[1] + 1) / self.seconds[(c, b)].value >= plain:  # could still beat a plain step
                out.append(c)
            if rate < self.margin * best:
                break
            best = max(best, rate)
        return out

    def choose(self, rows: int, greedy: bool):
        b = bucket(rows)
        r = self.rounds[b] = self.rounds.get(b, 0) + 1
        cands = self.live(b, greedy)
        if not self._measured(cands[-1], b):
            return cands[-1]
        best = max(cands, key=lambda c: self.expected_rate(c, b, greedy))
        due, wait, settled = self.explore.setdefault(b, [r + self.explore_every, self.explore_every, best])
        if best != settled:  # the choice changed: look around again soon
            self.explore[b] = [r + self.explore_every, self.explore_every, best]
        elif r >= due and len(cands) > 1:
            total, probes = self.spent.get(b, (0.0, 0.0))
            if probes <= self.budget * total:
                wait = min(2 * wait, self.max_explore_every)
                self.explore[b] = [r + wait, wait, best]
                self.probe[b] = min((c for c in cands if c != best), key=lambda c: self.seconds[(c, b)].last_round)
                return self.probe[b]
        return best

    def expected_rate(self, shape, b, greedy):
        """Expected tokens per second of a round with this candidate in bucket b (per row, up to a constant)."""
        tau = 1.0 if shape is PLAIN else self.tau.get((shape, greedy), self.tau.get((shape, not greedy), _Stat(1.0))).value
        return tau / max(self.seconds[(shape, b)].value, 1e-9)

    def observe(self, shape, rows: int, greedy: bool, seconds: float, tokens_per_row: float, switch_s: float = 0.0):
        """One round's measurement: its seconds (for the estimates) and switch_s, the one-off cost of switching to
        it (only for the re-measurement budget)."""
        b = bucket(rows)
        now = self.rounds.get(b, 0)
        spent = self.spent.setdefault(b, [0.0, 0.0])
        spent[0] += seconds + switch_s
        if self.probe.pop(b, "none") == shape:
            spent[1] += seconds + switch_s
        self.seconds.setdefault((shape, b), _Stat()).add(seconds / rows, self.alpha, now, skip_first=True)
        if shape is not PLAIN:
            self.tau.setdefault((shape, greedy), _Stat()).add(tokens_per_row, self.tau_alpha, now)

    def summary(self):
        """{bucket rows label: best candidate} with the current estimates, for logs and benchmarks."""
        out = {}
        for b in sorted(self.rounds):
            cands = [c for c in self.live(b, True) if self._measured(c, b)]
            if cands:
                label = f"{2 ** (b - 1) + 1}-{2 ** b}" if b > 1 else str(b + 1)
                out[label] = max(cands, key=lambda c: self.expected_rate(c, b, True))
        return out

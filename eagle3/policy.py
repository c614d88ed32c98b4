"""Adaptive speculation: pick each round's draft tree — or no tree at all — from measured throughput.

Whether a tree pays depends on the device and on how many rows share the verify forward: at batch 1 on a CPU a
16-node tree is nearly free (bench/results/engine.md), at batch 8 eight such trees cost more than they save. So the
policy measures instead of guessing. For every candidate (a plain step, or one of a few tree shapes no larger than
the configured one) it keeps
  - tau: tokens emitted per row per round (moving average; shared by all batch sizes, since acceptance depends on
    the head and the text, not on the batch), per greedy/sampled mode, and
  - seconds per round, per batch-size bucket (1, 2, 3-4, 5-8, ... rows),
and each round picks the candidate with the most expected tokens per second: tau / seconds. A candidate it has not
measured yet in a bucket is tried first; every `explore_every` rounds the stalest one is re-measured, so a choice
made on a noisy first sample is revisited. A plain step is tau = 1 by definition, so speculation is only used where
it measured faster than not speculating."""
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
    alpha: float = 0.2                  # weight of the newest sample in the moving averages
    explore_every: int = 64             # rounds per bucket between re-measurements of the stalest candidate
    tau: dict = field(default_factory=dict)      # (shape, greedy) -> _Stat
    seconds: dict = field(default_factory=dict)  # (shape, bucket) -> _Stat
    rounds: dict = field(default_factory=dict)   # bucket -> rounds decided

    @property
    def candidates(self):
        k, d, n = self.configured
        small = [s for s in SMALL_SHAPES if s[0] <= k and s[1] <= d and s[2] <= n]
        return [PLAIN, *dict.fromkeys(small + [self.configured])]

    def choose(self, rows: int, greedy: bool):
        b = bucket(rows)
        r = self.rounds[b] = self.rounds.get(b, 0) + 1
        cands = self.candidates
        for c in cands:  # measure every candidate twice before trusting any
            if self.seconds.get((c, b), _Stat()).n < 2:
                return c
        if r % self.explore_every == 0:
            return min(cands, key=lambda c: self.seconds[(c, b)].last_round)
        return max(cands, key=lambda c: self.expected_rate(c, b, greedy))

    def expected_rate(self, shape, b, greedy):
        """Expected tokens per row per second of a round with this candidate in bucket b."""
        tau = 1.0 if shape is PLAIN else self.tau.get((shape, greedy), self.tau.get((shape, not greedy), _Stat(1.0))).value
        return tau / max(self.seconds[(shape, b)].value, 1e-9)

    def observe(self, shape, rows: int, greedy: bool, seconds: float, tokens_per_row: float):
        b = bucket(rows)
        now = self.rounds.get(b, 0)
        self.seconds.setdefault((shape, b), _Stat()).add(seconds, self.alpha, now, skip_first=True)
        if shape is not PLAIN:
            self.tau.setdefault((shape, greedy), _Stat()).add(tokens_per_row, self.alpha, now)

    def summary(self):
        """{bucket rows label: best candidate} with the current estimates, for logs and benchmarks."""
        out = {}
        for b in sorted(self.rounds):
            if all(self.seconds.get((c, b), _Stat()).n >= 1 for c in self.candidates):
                label = f"{2 ** (b - 1) + 1}-{2 ** b}" if b > 1 else str(b + 1)
                out[label] = max(self.candidates, key=lambda c: self.expected_rate(c, b, True))
        return out

"""t(rows, nodes): the seconds of one target forward that verifies `nodes` tree nodes in each of `rows` rows, on this
machine, for this target and dtype. Measured once (a few seconds) and cached as JSON under the cache directory, so a
draft budget can be priced from the device's cost curve instead of from trial rounds at run time.

    python -m eagle3.profile [--target NAME] [--dtype bf16|fp32] [--force]
"""
import argparse
import hashlib
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from . import compiled, hardware
from .layers import few_rows, row_chunks, weight_format
from .target import cache_dir

ROWS = (1, 2, 4, 8, 16, 32, 64)
NODES = compiled.BUCKETS  # larger trees are extrapolated (the cost is linear there), so a first profile compiles
# no bucket that the default trees never use
CONTEXT = 256  # committed tokens per row: attention over them is part of the cost
MAX_TOKENS = 512  # larger forwards are extrapolated from a row's last two cells: the cost is linear there


@dataclass
class Profile:
    key: str
    rows: list
    nodes: list
    seconds: list  # seconds[i][j]: rows[i] rows x nodes[j] nodes

    def __post_init__(self):
        self._priced = envelope(self.seconds)  # what cost() reads; seconds stay as measured

    def cost(self, rows, nodes):
        """Seconds of a verify forward, interpolated (linearly, and past the grid's end too) in rows, then nodes, on
        the grid's envelope."""
        per_nodes = [_interp(rows, self.rows, [s[j] for s in self._priced]) for j in range(len(self.nodes))]
        return _interp(nodes, self.nodes, per_nodes)


def envelope(seconds):
    """The grid with no cell above one of more rows or nodes (the smallest from there on): a forward of fewer tokens
    does less of the same work, so a cell above a bigger one was measured while something else ran (a profile measured
    beside a test run had t(1, 2) 11.8 ms against t(1, 4) 9.6, and the budget then priced a 2-node tree as dearer than
    a 4-node one)."""
    out = [list(line) for line in seconds]
    for i in reversed(range(len(out))):
        for j in reversed(range(len(out[i]))):
            if j + 1 < len(out[i]):
                out[i][j] = min(out[i][j], out[i][j + 1])
            if i + 1 < len(out):
                out[i][j] = min(out[i][j], out[i + 1][j])
    return out


def _interp(x, xs, ys):
    if len(xs) == 1:
        return ys[0] * x / xs[0]
    i = next((i for i in range(1, len(xs) - 1) if x <= xs[i]), len(xs) - 1)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return max(y0 + (y1 - y0) * (x - x0) / (x1 - x0), 0.0)


def profile_key(target) -> str:
    """What the cost depends on: the machine, the target (name and size), its dtype and device, weight format,
    row chunks, compiled steps (and their wrapper) and the engine's own kernels."""
    w = target.model.embed_tokens.weight
    params = sum(p.numel() for p in target.model.parameters())
    chunk = hardware.row_chunk(target.model)
    wrapper = "C++" if compiled._options()["cpp_wrapper"] else "Python"
    return (f"{hardware.describe()} | {target.name} ({params} parameters) | {w.dtype} | {w.device} | "
            f"weights {weight_format(target.model)} | row chunks {chunk} from {hardware.ROW_CHUNK_FROM} rows | "
            f"VNNI kernel to batch {hardware.few_rows_until(target.model)} | "
            f"compiled steps {compiled.available(target.model)} ({wrapper} wrapper) | kernels {kernels_digest()}")


def kernels_digest() -> str:
    """A digest of the engine's kernel sources (eagle3/kernels): a changed kernel changes the costs, and a profile
    kept from before it would price every tree wrongly (on a Zen 3 EPYC a cached profile still had t(1, 1) = 18.5 ms
    after kernel fixes had brought a plain step to ~9)."""
    h = hashlib.sha256()
    for path in sorted((Path(__file__).parent / "kernels").glob("*.cpp")):
        h.update(path.read_bytes())
    return h.hexdigest()[:12]


def _fastest_s(fn, reps):
    """The fastest of `reps` timed calls: other work on the machine only ever adds time, and a profile measured
    beside it is cached for good (one measured on 2026-12-07 beside a build and a training run had 4.5 s cells in a
    row of 10 ms ones; the draft budget rescales the whole curve to the seconds it measures anyway)."""
    fn()  # warm-up: one-off kernel set-up is not the steady cost
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


@torch.no_grad()
def measure(target, rows=ROWS, nodes=NODES, context=CONTEXT, reps=3, max_tokens=MAX_TOKENS) -> Profile:
    model, dev = target.model, target.model.embed_tokens.weight.device
    context = min(context, target.max_context - max(nodes) - 1)
    chunk, steps, few = hardware.row_chunk(model), compiled.available(model), hardware.few_rows_until(model)
    seconds = []
    for B in rows:
        cache = model.new_cache(B, context + max(nodes))
        cache.lens[:] = context  # the K/V values do not change the cost
        line = []
        for N in nodes:
            if B * N > max_tokens and len(line) >= 2:
                line.append(_interp(N, nodes[: len(line)], line))
                continue
            toks = torch.randint(0, target.config.vocab_size, (B, N), device=dev)
            pos = (context + torch.arange(N, device=dev)).expand(B, N)
            mask = torch.ones(N, N, dtype=torch.bool, device=dev).tril().expand(B, N, N)  # a chain costs as any tree
            chunked = chunk if B >= hardware.ROW_CHUNK_FROM else None
            with row_chunks(chunked), few_rows(B <= few), compiled.compiled_steps(steps and chunked is None):  # as
                # the decoder runs a call of B rows
                line.append(_fastest_s(lambda: model(toks, pos, cache, mask), reps))
        seconds.append(line)
    return Profile(profile_key(target), list(rows), list(nodes), seconds)


def profile_path(target) -> Path:
    return cache_dir() / "profiles" / (hashlib.sha256(profile_key(target).encode()).hexdigest()[:16] + ".json")


def load_or_measure(target, force=False, **kw) -> Profile:
    """The cached profile for this machine, target and dtype; measured (and cached) when there is none."""
    path = profile_path(target)
    if path.exists() and not force:
        return Profile(**json.loads(path.read_text()))
    prof = measure(target, **kw)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(prof), indent=1))
    tmp.replace(path)  # never a half-written profile, even if two processes measure at once
    return prof


def main():
    from .target import DEFAULT_TARGET, load_target

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=DEFAULT_TARGET)
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--force", action="store_true", help="measure again even if a profile is cached")
    a = ap.parse_args()
    target = load_target(a.target, dtype=a.dtype)
    prof = load_or_measure(target, force=a.force)
    print(prof.key)
    print(profile_path(target))
    print("| rows \\ nodes | " + " | ".join(map(str, prof.nodes)) + " |")
    print("|---|" + "---|" * len(prof.nodes))
    for r, line in zip(prof.rows, prof.seconds):
        print(f"| {r} | " + " | ".join(f"{s * 1e3:.1f} ms" for s in line) + " |")


if __name__ == "__main__":
    main()

"""What attention costs on this CPU: the fp32 kernel (eagle3/attention.py) against float64 SDPA, which bf16 CPU models
used before it, and one compiled decode / verify forward of the default target with each. Writes
bench/results/attention.md.

    python -m bench.attention [--context 300] [--reps 20]

Part 1: one layer's attention (SmolLM2-135M: 9 query heads, 3 K/V heads, head dim 64) at the batch sizes and new-token
counts of decode (1) and verify (2, 4, 16) forwards, the two alternated per shape, medians.
Part 2: the whole forward in fresh processes (the kernel is chosen when a model loads), EAGLE3_ATTENTION=1 and 0
alternated, each timing compiled forwards at batch 1, 8 and 32 with 1, 2 and 4 new tokens per row."""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from eagle3 import attention, hardware

ROOT = Path(__file__).resolve().parent.parent
SHAPES = [(1, 1), (1, 16), (8, 1), (8, 2), (32, 1), (32, 2), (64, 1)]  # (rows, new tokens per row)


def float64_sdpa(q, k, v, mask):
    """The former path: float64 SDPA with the grouped query heads folded (layers.attend's fallback)."""
    B, Hq, T, D = q.shape
    g = Hq // k.shape[1]
    q = q.reshape(B, k.shape[1], g * T, D)
    m = mask[:, :, None].expand(B, 1, g, T, mask.shape[-1]).reshape(B, 1, g * T, mask.shape[-1])
    return F.scaled_dot_product_attention(q, k, v, attn_mask=m).view(B, Hq, T, D)


def _time(fn, reps):
    fn()
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return statistics.median(out)


def op_table(context, reps):
    rows = ["| rows x new tokens | kernel fp32 | float64 SDPA | ratio |", "|---|---|---|---|"]
    for B, T in SHAPES:
        S = context + T
        q, k, v = torch.randn(B, 9, T, 64), torch.randn(B, 3, S, 64), torch.randn(B, 3, S, 64)
        mask = torch.ones(B, 1, T, S, dtype=torch.bool)
        qd, kd, vd = q.double(), k.double(), v.double()
        a, b = [], []
        for _ in range(3):  # alternated
            a.append(_time(lambda: attention.attend(q, k, v, mask), reps))
            b.append(_time(lambda: float64_sdpa(qd, kd, vd, mask), reps))
        ka, kb = min(a), min(b)
        rows.append(f"| {B} x {T} | {ka * 1e6:.0f} us | {kb * 1e6:.0f} us | {kb / ka:.2f}x |")
    return rows


CHILD = """
import json, statistics, sys, time, torch
from eagle3 import compiled
from eagle3.target import DEFAULT_TARGET, load_target
m = load_target(DEFAULT_TARGET).model
ctx, reps, out = int(sys.argv[1]), int(sys.argv[2]), {}
for B in (1, 8, 32):
    for N in (1, 2, 4):
        cache = m.new_cache(B, ctx + N); cache.lens[:] = ctx
        toks, pos = torch.randint(0, 1000, (B, N)), (ctx + torch.arange(N)).expand(B, N)
        mask = torch.ones(N, N, dtype=torch.bool).tril().expand(B, N, N)
        with compiled.compiled_steps(True):
            for _ in range(3): m(toks, pos, cache, mask)
            ts = []
            for _ in range(reps):
                t = time.perf_counter(); m(toks, pos, cache, mask); ts.append(time.perf_counter() - t)
        out[f"{B}x{N}"] = statistics.median(ts)
print(json.dumps({"dtype": str(m.new_cache(1, 1).dtype), "s": out}))
"""


def forward_table(context, reps, rounds=2):
    runs = {"1": [], "0": []}
    for _ in range(rounds):
        for flag in ("1", "0"):
            env = dict(os.environ, EAGLE3_ATTENTION=flag, PYTHONPATH=str(ROOT))
            res = subprocess.run([sys.executable, "-c", CHILD, str(context), str(reps)], env=env, cwd=ROOT,
                                 capture_output=True, text=True, check=True)
            runs[flag].append(json.loads(res.stdout.strip().splitlines()[-1]))
    keys = list(runs["1"][0]["s"])
    best = {f: {k: min(r["s"][k] for r in runs[f]) for k in keys} for f in runs}
    rows = [f"| rows x new tokens | kernel ({runs['1'][0]['dtype']} K/V) | float64 SDPA ({runs['0'][0]['dtype']} K/V) "
            "| ratio |", "|---|---|---|---|"]
    for k in keys:
        a, b = best["1"][k], best["0"][k]
        rows.append(f"| {k.replace('x', ' x ')} | {a * 1e3:.1f} ms | {b * 1e3:.1f} ms | {b / a:.2f}x |")
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--context", type=int, default=300, help="committed tokens per row")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "attention.md"))
    a = ap.parse_args()
    if not attention.available():
        sys.exit("the attention kernel did not build here")
    lines = [f"# Attention: fp32 kernel vs float64 SDPA ({time.strftime('%Y-%m-%d %H:%M')})", "",
             f"CPU: {hardware.describe()}; context {a.context} committed tokens per row.", "",
             "## One layer's attention (9 query heads, 3 K/V heads, head dim 64), best of 3 alternated medians", ""]
    lines += op_table(a.context, a.reps)
    print("\n".join(lines), flush=True)
    more = ["", "## One compiled forward of SmolLM2-135M-Instruct (int4, bf16), fresh processes alternated, best of "
            "2 medians", ""] + forward_table(a.context, a.reps)
    print("\n".join(more))
    Path(a.out).write_text("\n".join(lines + more) + "\n")


if __name__ == "__main__":
    main()

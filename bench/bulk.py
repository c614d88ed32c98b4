"""Speculation inside bulk batches: the worker's default decoder and each drafter, all with the draft budget
(adaptive), against the same engine's vanilla decode, side by side in one run, alternated, at several batch sizes,
on two workloads: the general held-out prompts and a copy-heavy job (bench/copyjob.py). Greedy; every output is
checked token for token against vanilla. Each decoder is warmed up first on other prompts of the same workload,
as a running worker is (its calibration and cost scales settle). Writes bench/results/bulk.md with the CPU flags.

    python -m bench.bulk [--batch 1 8 32 64] [--prompts 64] [--max-new-tokens 96] [--reps 2]
"""
import argparse
import sys
import time
from pathlib import Path

from bench.copyjob import copy_prompts
from eagle3 import SpeculativeDecoder, hardware, load_target
from eagle3.prompts import heldout_prompts

OUT = Path(__file__).resolve().parent / "results" / "bulk.md"
DRAFTERS = ("eagle", "suffix", "hybrid")


def workloads(n):
    general = [p["prompt"] for p in heldout_prompts(2 * n)]
    copy = copy_prompts(2 * n, seed=7)
    return {"general": (general[:n], general[n:]), "copy-heavy": (copy[:n], copy[n:])}


def timed(dec, prompts, batch, max_new, speculative):
    res = dec.generate(prompts, max_new, batch_size=batch, speculative=speculative)
    s = dec.last_stats
    return dict(tokens=s["new_tokens"], seconds=s["wall_time_s"], tau=s["accept_length"],
                plain=s["plain_steps"], ids=[r.token_ids for r in res])


def run(target, work, batch, a, log):
    """One workload at one batch size: warm-up, then reps x every contender, the order rotating each rep."""
    prompts, warm = work
    decs = {d: SpeculativeDecoder(target, drafter=d) for d in a.drafters}
    for d, dec in decs.items():
        dec.warm_up(batch)
        dec.generate(warm[: max(2 * batch, 8)], a.max_new_tokens, batch_size=batch)
    names = ["vanilla", *decs]
    total = {n: dict(tokens=0, seconds=0.0, tau=[], plain=0, ids=None) for n in names}
    for rep in range(a.reps):
        for name in names[rep % len(names):] + names[: rep % len(names)]:
            dec = decs.get(name) or next(iter(decs.values()))
            r = timed(dec, prompts, batch, a.max_new_tokens, name != "vanilla")
            t = total[name]
            t["tokens"] += r["tokens"]
            t["seconds"] += r["seconds"]
            t["tau"].append(r["tau"])
            t["plain"] += r["plain"]
            t["ids"] = r["ids"]
            log(f"  {name:<8} rep {rep}: {r['tokens'] / r['seconds']:7.1f} tok/s  tau {r['tau']:.2f}")
    van = total["vanilla"]
    rows = []
    for name in names:
        t = total[name]
        same = sum(x == y for x, y in zip(t["ids"], van["ids"]))
        rows.append(dict(name=name, tps=t["tokens"] / t["seconds"], tau=sum(t["tau"]) / len(t["tau"]),
                         x=(t["tokens"] / t["seconds"]) / (van["tokens"] / van["seconds"]), same=same,
                         plain=t["plain"], budget=decs[name].budget.summary() if name in decs else None))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32, 64])
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--drafters", nargs="+", default=list(DRAFTERS), choices=DRAFTERS)
    ap.add_argument("--workloads", nargs="+", default=["general", "copy-heavy"])
    ap.add_argument("--out", type=Path, default=OUT)
    a = ap.parse_args()
    log = lambda *x: print(*x, file=sys.stderr, flush=True)  # noqa: E731
    target, start = load_target(), time.time()
    log(hardware.describe())
    works = workloads(a.prompts)
    lines = ["# Speculation inside bulk batches", "", f"`python -m bench.bulk {' '.join(sys.argv[1:])}` — "
             f"{time.strftime('%Y-%m-%d')}. Machine: {hardware.describe()}. Target {target.name}, "
             f"{target.model.embed_tokens.weight.dtype}, shipped head, greedy, {a.prompts} prompts per workload, "
             f"{a.max_new_tokens} new tokens max, {a.reps} alternated reps per contender. Speculative decoders use "
             "the draft budget (the worker's default, adaptive). 'identical': outputs token-identical to vanilla.", "",
             "| workload | batch | decoder | tokens/s | × vanilla | tau | identical | plain row-steps | budget's rounds |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name in a.workloads:
        for batch in a.batch:
            log(f"{name}, batch {batch}")
            for r in run(target, works[name], batch, a, log):
                lines.append(f"| {name} | {batch} | {r['name']} | {r['tps']:.1f} | {r['x']:.2f} | {r['tau']:.2f} | "
                             f"{r['same']}/{a.prompts} | {r['plain']} | {r['budget'] or '-'} |")
    lines += ["", f"Wall time {(time.time() - start) / 60:.1f} min.", ""]
    a.out.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()

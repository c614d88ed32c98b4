"""The benchmark report: every decoder side by side in one run, on the held-out prompts, at several batch sizes,
plus one bulk job end to end through API + queue + worker. Writes bench/RESULTS.md and bench/results/speed.png.

    python -m bench.report [--prompts 32] [--max-new-tokens 64] [--batch 1 8 32] [--no-e2e]

Decoders (greedy): HF transformers generate(); HF prompt-lookup decoding (generate(prompt_lookup_num_tokens=10),
which HF supports at batch 1 only, so at larger batches its rows run one at a time); the engine's vanilla decode;
EAGLE-3 with the fixed default tree (adaptive=False); EAGLE-3 as the worker runs it (adaptive, the default); and
adaptive EAGLE-3 with validation_threshold=0.9 (not lossless). The adaptive decoders are warmed up first on other
prompts at each batch size, as a long-running worker is: the draft budget has then calibrated its acceptance estimates."""
import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import torch

from bench.acceptance import hf_generate
from eagle3 import SpeculativeDecoder, load_target
from eagle3.prompts import heldout_prompts, training_prompts

ROOT = Path(__file__).resolve().parent.parent


def engine_run(dec, prompts, max_new_tokens, batch, speculative=True):
    res = dec.generate(prompts, max_new_tokens, batch_size=batch, speculative=speculative)
    s = dec.last_stats
    return dict(tps=s["tokens_per_s"], tau=s["accept_length"], ids=[r.token_ids for r in res],
                plain=s.get("plain_steps", 0) if speculative else None)


def e2e(n_prompts, max_new_tokens, log):
    """One bulk job through scripts/demo.sh (gunicorn + a Celery worker on the real Postgres/Redis), timed from
    submission to completion."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = ROOT / "runs" / "bench" / "e2e.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PORT": str(port), "CELERY_QUEUE": f"eagle3-bench-{port}"}
    cmd = ["bash", "scripts/demo.sh", "--heldout", str(n_prompts), "--max-new-tokens", str(max_new_tokens),
           "--json", str(out), "--quiet"]
    log(f"end to end: {' '.join(cmd)}")
    subprocess.run(cmd, cwd=ROOT, env=env, check=True)
    return json.loads(out.read_text())


def plot(rows, batches, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(r["name"] for r in rows))
    fig, ax = plt.subplots(figsize=(9, 4.5))
    w = 0.8 / len(names)
    for i, name in enumerate(names):
        xs = [b + (i - len(names) / 2 + 0.5) * w for b in range(len(batches))]
        ys = [next((r["x_van"] for r in rows if r["name"] == name and r["batch"] == bt), 0) for bt in batches]
        ax.bar(xs, ys, w, label=name)
    ax.axhline(1.0, color="black", lw=0.8, ls="--")
    ax.set_xticks(range(len(batches)), [f"batch {b}" for b in batches])
    ax.set_ylabel("tokens/s relative to the engine's vanilla decode")
    ax.set_title("Greedy decoding on held-out prompts, one run, side by side")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--e2e-prompts", type=int, default=32)
    ap.add_argument("--no-e2e", action="store_true")
    ap.add_argument("--no-hf", action="store_true")
    ap.add_argument("--target", default=None, help="default: the shipped default target")
    ap.add_argument("--out", default=str(ROOT / "bench" / "RESULTS.md"))
    ap.add_argument("--plot", default=str(ROOT / "bench" / "results" / "speed.png"))
    a = ap.parse_args()
    log = lambda *x: print(*x, file=sys.stderr, flush=True)  # noqa: E731
    target = load_target(a.target) if a.target else load_target()
    prompts = [p["prompt"] for p in heldout_prompts()][: a.prompts]
    warm = [p["prompt"] for p in training_prompts(64)][-max(a.batch) * 2:]
    fixed = SpeculativeDecoder(target, adaptive=False)
    decoders = {"EAGLE-3 fixed tree": fixed, "EAGLE-3 adaptive (worker default)": SpeculativeDecoder(target),
                "EAGLE-3 adaptive, threshold 0.9": SpeculativeDecoder(target, validation_threshold=0.9)}
    rows, t_start = [], time.time()
    for b in a.batch:
        log(f"batch {b}: warming up the adaptive decoders")
        for name, dec in decoders.items():
            if dec.budget:
                for _ in range(2):
                    dec.generate(warm[: max(b, 4) * 2], a.max_new_tokens, batch_size=b)
        log(f"batch {b}: vanilla")
        van = engine_run(fixed, prompts, a.max_new_tokens, b, speculative=False)
        results = [("engine vanilla", van)]
        if not a.no_hf:
            log(f"batch {b}: HF generate()")
            results.append(("HF generate()", dict(tps=hf_generate(prompts, target, a.max_new_tokens, b), tau=1.0)))
            log(f"batch {b}: HF prompt lookup (batch 1 only: rows one at a time)")
            pld = hf_generate(prompts, target, a.max_new_tokens, 1, prompt_lookup=10)
            results.append(("HF prompt lookup", dict(tps=pld, tau=None)))
        for name, dec in decoders.items():
            log(f"batch {b}: {name}")
            results.append((name, engine_run(dec, prompts, a.max_new_tokens, b)))
        hf = next((r["tps"] for n, r in results if n == "HF generate()"), None)
        for name, r in results:
            same = sum(x == y for x, y in zip(r["ids"], van["ids"])) if "ids" in r else None
            rows.append(dict(batch=b, name=name, tps=r["tps"], tau=r["tau"], x_van=r["tps"] / van["tps"],
                             x_hf=r["tps"] / hf if hf else None, same=same, plain=r.get("plain")))
            log(f"  {name:<36} {r['tps']:7.1f} tok/s  {r['tps'] / van['tps']:.2f}x vanilla")
    adaptive = decoders["EAGLE-3 adaptive (worker default)"].budget
    end = e2e(a.e2e_prompts, a.max_new_tokens, log) if not a.no_e2e else None
    write(a, rows, adaptive, end, target, fixed, len(prompts), time.time() - t_start)
    plot(rows, a.batch, a.plot)
    log(f"wrote {a.out} and {a.plot}")


def write(a, rows, policy, end, target, dec, n_prompts, wall):
    f = lambda v, s=".2f": "-" if v is None else format(v, s)  # noqa: E731
    lines = [
        "# Benchmark report", "",
        f"`python -m bench.report` — {time.strftime('%Y-%m-%d')}, {torch.get_num_threads()} torch threads, device "
        f"{target.device}, target {target.name}, shipped head (draft vocab {dec.head.config.draft_vocab_size}), "
        f"{n_prompts} held-out prompts, {a.max_new_tokens} new tokens max, greedy. All rows of a batch size come "
        f"from one run, side by side (ratios; the machine is noisy). Report wall time {wall / 60:.1f} min.", "",
        "tau = new tokens per target forward after the prefill (plain steps count as 1). 'identical' = outputs "
        "token-identical to the engine's vanilla decode. 'plain steps' = rows decoded with a plain step because the "
        "draft budget priced no draft node as paying at that batch size.", "",
        "| batch | decoder | tokens/s | tau | × vanilla | × HF generate | identical | plain steps |",
        "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        same = f"{r['same']}/{n_prompts}" if r["same"] is not None else "-"
        lines.append(f"| {r['batch']} | {r['name']} | {r['tps']:.1f} | {f(r['tau'])} | {r['x_van']:.2f} | "
                     f"{f(r['x_hf'])} | {same} | {r['plain'] if r['plain'] is not None else '-'} |")
    lines += ["", "Draft budget's choices per batch size in this run (share of rounds by draft depth): "
              f"`{policy.summary()}`", "", "![speed](results/speed.png)", ""]
    if end:
        st = end["job"]["stats"]
        lines += ["## End to end: API + queue + worker", "",
                  f"One bulk job of {end['items']} held-out prompts through `scripts/demo.sh` (gunicorn, Redis, one "
                  f"Celery worker, BATCH_SIZE {end.get('batch_size', 8)}, measure_baseline=true), timed from "
                  "submission to `completed`:", "",
                  "| items | wall s | items/s | new tokens | tokens/s (wall) | tau | measured speedup |", "|---|---|---|---|---|---|---|",
                  f"| {end['items']} | {end['wall_s']:.1f} | {end['items'] / end['wall_s']:.2f} | {st['new_tokens']} | "
                  f"{st['new_tokens'] / end['wall_s']:.1f} | {f(st.get('mean_accept_length'))} | {f(st.get('speedup'))}× |", "",
                  "The wall time includes the baseline sample decoded without speculation; the job's own speedup "
                  "compares speculative and plain decoding of that sample in identical batches.", ""]
    Path(a.out).write_text("\n".join(lines))


if __name__ == "__main__":
    main()

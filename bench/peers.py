"""Peers: llama.cpp on the same GGUF against this engine (vanilla and EAGLE-3), at batch 1, 8 and 32, in one run with
the contenders alternated. Writes bench/results/peers.md with the machine's CPU flags. Not part of CI.

    python -m bench.peers --llama-bin DIR [--batches 1 8 32] [--reps 3] [--max-new-tokens 64]

llama.cpp: DIR holds `llama-bench` and `llama-batched-bench` built from the llama-cpp-python sdist pinned in
requirements-bench.txt (its vendor/llama.cpp): `bash bench/build_llama_cpp.sh` builds them and prints DIR. Both run on the engine's own
GGUF file with as many threads as torch uses.

What is compared, per batch size B (B sequences of `--max-new-tokens` tokens, end-of-turn ignored so every row
decodes the full length, as llama-batched-bench does):
- decode tok/s: new tokens / decode time. llama.cpp: llama-batched-bench's S_TG at B sequences, prompts of the
  engine's mean prompt length. Engine: B held-out prompts in one generate() call, minus the same call's prefill
  (timed separately with one new token).
- at B = 1 also llama-bench's tg (decoding from an empty context, llama.cpp's headline number).
The engine decodes held-out chat prompts; EAGLE-3 is the worker's default decoder (adaptive), warmed up first on
other prompts as a long-running worker is. `--eager` adds the engine with compiled steps off (eagle3/compiled.py),
vanilla and EAGLE-3, in the same alternation."""
import argparse
import json
import statistics
import subprocess
import time
from pathlib import Path

import torch

from eagle3 import SpeculativeDecoder, hardware, load_target
from eagle3.layers import weight_format
from eagle3.prompts import heldout_prompts, training_prompts
from eagle3.target import default_gguf

FORMATS = {"int4": ": the GGUF Q4_1 blocks through torch's int4 kernel",
           "int4 (AMX kernel)": ": the GGUF Q4_1 blocks and Q8_0 lm_head through the engine's AMX kernel (eagle3/amx.py)",
           "int4 (VNNI kernel)": ": the GGUF Q4_1 blocks and Q8_0 lm_head through the engine's VNNI kernel (eagle3/vnni.py)",
           "int4 (AVX2 kernel)": ": the GGUF Q4_1 blocks and Q8_0 lm_head through the VNNI kernel's AVX2 build (eagle3/vnni.py)",
           "int4 (AVX2 kernel, 1-digit activations)": ": the GGUF Q4_1 blocks and Q8_0 lm_head through the VNNI kernel's "
                                                      "AVX2 build (eagle3/vnni.py), activations in one int8 digit",
           "int8": ": int8 weights through fbgemm, per-row int8 activations"}

ROOT = Path(__file__).resolve().parent.parent


def llama_batched(bin_dir, gguf, batch, prompt_len, new_tokens, threads):
    out = subprocess.run([str(Path(bin_dir) / "llama-batched-bench"), "-m", str(gguf), "-t", str(threads),
                          "-c", str(batch * (prompt_len + new_tokens) + 64), "-npp", str(prompt_len),
                          "-ntg", str(new_tokens), "-npl", str(batch), "--output-format", "jsonl"],
                         capture_output=True, text=True, check=True).stdout
    row = json.loads([line for line in out.splitlines() if line.startswith("{")][-1])
    return row["speed_tg"]


def llama_tg(bin_dir, gguf, new_tokens, threads):
    out = subprocess.run([str(Path(bin_dir) / "llama-bench"), "-m", str(gguf), "-t", str(threads), "-p", "0",
                          "-n", str(new_tokens), "-r", "3", "-o", "jsonl"], capture_output=True, text=True,
                         check=True).stdout
    return json.loads([line for line in out.splitlines() if line.startswith("{")][-1])["avg_ts"]


def batch_prompts(prompts, batch):
    """The prompts of one call at `batch` rows: `batch` of them (the list repeated as needed), 4 at batch 1."""
    return (prompts * (1 + batch // len(prompts)))[: batch if batch > 1 else 4]


def warm_prompts(batch):
    """`batch` training prompts (never the measured held-out ones) to warm a decoder up at that batch size."""
    return [p["prompt"] for p in training_prompts(2 * batch)[-batch:]]


def engine_decode(dec, prompts, batch, new_tokens, speculative, compiled):
    """Decode tok/s of one generate() call over `prompts` at `batch`: its wall time minus its prefill's.
    compiled: whether the call runs compiled steps (eagle3/compiled.py)."""
    dec.compiled = compiled
    t = time.perf_counter()
    dec.generate(prompts, max_new_tokens=1, batch_size=batch, speculative=False)
    prefill = time.perf_counter() - t
    t = time.perf_counter()
    res = dec.generate(prompts, max_new_tokens=new_tokens, batch_size=batch, speculative=speculative)
    wall = time.perf_counter() - t
    n = sum(len(r.token_ids) for r in res)
    return (n - len(prompts)) / max(wall - prefill, 1e-9), dec.last_stats["accept_length"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-bin", required=True, help="directory with llama-bench and llama-batched-bench")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "peers.md"))
    ap.add_argument("--eager", action="store_true", help="also the engine with compiled steps off")
    a = ap.parse_args()
    threads = torch.get_num_threads()
    machine = hardware.describe()
    print(machine, flush=True)
    target = load_target()
    target.eos_ids = []  # every row decodes the full length, as llama-batched-bench's sequences do
    dec = SpeculativeDecoder(target)
    compiled = dec.compiled  # where this engine can run them
    gguf = default_gguf()
    prompts = [p["prompt"] for p in heldout_prompts()]
    prompt_len = round(statistics.mean(target.count_tokens(p) for p in prompts[:32]))
    rows = []
    tg = statistics.median(llama_tg(a.llama_bin, gguf, a.max_new_tokens, threads) for _ in range(a.reps))
    for batch in a.batches:
        ps, warm = batch_prompts(prompts, batch), warm_prompts(batch)
        for mode in {compiled, compiled and not a.eager}:  # warm the draft budget and each mode's graphs, as a
            dec.compiled = mode                              # running worker is
            dec.warm_up(batch)
            dec.generate(warm, max_new_tokens=32, batch_size=batch)
        got = {"llama.cpp": [], "engine vanilla": [], "engine EAGLE-3": []}
        if a.eager:
            got.update({"vanilla, eager steps": [], "EAGLE-3, eager steps": []})
        taus = []
        for rep in range(a.reps):  # alternated: one of each per repetition
            got["llama.cpp"].append(llama_batched(a.llama_bin, gguf, batch, prompt_len, a.max_new_tokens, threads))
            got["engine vanilla"].append(engine_decode(dec, ps, batch, a.max_new_tokens, False, compiled)[0])
            tps, tau = engine_decode(dec, ps, batch, a.max_new_tokens, True, compiled)
            got["engine EAGLE-3"].append(tps)
            taus.append(tau)
            if a.eager:
                got["vanilla, eager steps"].append(engine_decode(dec, ps, batch, a.max_new_tokens, False, False)[0])
                got["EAGLE-3, eager steps"].append(engine_decode(dec, ps, batch, a.max_new_tokens, True, False)[0])
            print(f"batch {batch} rep {rep}: " + ", ".join(f"{k} {v[-1]:.1f}" for k, v in got.items()), flush=True)
        med = {k: statistics.median(v) for k, v in got.items()}
        rows.append((batch, med, statistics.median(taus)))
    write(a.out, machine, target, prompt_len, a, tg, rows, compiled)


def write(path, machine, target, prompt_len, a, tg, rows, compiled):
    dtype = str(target.model.embed_tokens.weight.dtype).removeprefix("torch.")
    fmt = weight_format(target.model)
    few = hardware.few_rows_until(target.model)
    if few:  # AMX CPUs: small calls run the other kernel (eagle3/layers.py few_rows)
        fmt += f"{FORMATS.get(fmt, '')}, calls of batch {few} or less through the engine's VNNI kernel (eagle3/vnni.py)"
    lines = [f"# Peers: llama.cpp vs this engine on the same GGUF ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})",
             "", f"Machine: {machine}.", f"Engine: {dtype} activations, linears {fmt}{FORMATS.get(fmt, '')}; "
             f"{a.max_new_tokens} new tokens per sequence, prompts of ~{prompt_len} tokens; median of {a.reps} "
             "alternated repetitions. Decode tok/s (prefill excluded). `python -m bench.peers` wrote this file.", "",
             f"llama.cpp `llama-bench` tg{a.max_new_tokens} (batch 1, empty context): **{tg:.1f} tok/s**", "",
             "| batch | llama.cpp | engine vanilla | engine EAGLE-3 (adaptive) | tau | vanilla / llama.cpp | "
             "EAGLE-3 / llama.cpp | EAGLE-3 / vanilla |", "|---|---|---|---|---|---|---|---|"]
    for batch, m, tau in rows:
        l, v, e = m["llama.cpp"], m["engine vanilla"], m["engine EAGLE-3"]
        lines.append(f"| {batch} | {l:.1f} | {v:.1f} | {e:.1f} | {tau:.2f} | {v / l:.2f}x | {e / l:.2f}x | {e / v:.2f}x |")
    if "vanilla, eager steps" in rows[0][1]:
        lines += ["", f"Compiled steps ({'on' if compiled else 'not available here'}) against eager steps, "
                  "same run:", "", "| batch | vanilla eager | vanilla compiled | compiled / eager | EAGLE-3 eager | "
                  "EAGLE-3 compiled | compiled / eager |", "|---|---|---|---|---|---|---|"]
        for batch, m, _ in rows:
            ve, vc, ee, ec = m["vanilla, eager steps"], m["engine vanilla"], m["EAGLE-3, eager steps"], m["engine EAGLE-3"]
            lines.append(f"| {batch} | {ve:.1f} | {vc:.1f} | {vc / ve:.2f}x | {ee:.1f} | {ec:.1f} | {ec / ee:.2f}x |")
    Path(path).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

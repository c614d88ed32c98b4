"""The engine's decode speed by weight format on this CPU, side by side in one run, formats alternated: the evidence
behind load_target's choice of weights by hardware (eagle3/target.py). Writes bench/results/formats.md.

    python -m bench.formats [--batches 1 8 32] [--reps 3] [--max-new-tokens 64] [--formats NAME ...] [--eagle]

Formats (those this CPU cannot run are left out):
- fp32 + int8 (fbgemm): what CPUs without AVX512-BF16 ran before the VNNI kernel (eagle3/int8.py);
- fp32 + int4 (AVX2 build), fp32 + int4 (VNNI build): the GGUF's Q4_1 blocks through the VNNI kernel's builds
  (eagle3/vnni.py), fp32 activations;
- bf16 + int4 (VNNI build), bf16 + int4 (AMX kernel): the bf16 engine's own kernels where the CPU has them;
- bf16 + int4 (VNNI build, 1 digit): activations in one int8 digit (llama.cpp's precision, eagle3/vnni.py digits).
Each format is a full engine (target, draft head, compiled steps where they run: int8 steps stay eager where torch
runs AVX-512 code, eagle3/compiled.py) in its own process, loaded by the environment a user would set (FORMATS),
decoding held-out chat prompts, every row the full length; decode tok/s excludes the prefill (bench/peers.py
engine_decode). --eagle adds the adaptive EAGLE-3 decoder of each format.

To see what a CPU with AVX2 alone would pick, narrow torch's, oneDNN's and fbgemm's kernels on a bigger CPU:
ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 FBGEMM_ENABLE_INSTRUCTIONS=AVX2 (the engine's attention kernel keeps
the machine's width)."""
import argparse
import multiprocessing as mp
import os
import statistics
import time
from pathlib import Path

from eagle3 import amx, hardware, vnni

ROOT = Path(__file__).resolve().parent.parent

# name -> (the environment that loads it, whether this CPU can run it)
FORMATS = {
    "fp32 + int8 (fbgemm)": ({"EAGLE3_DTYPE": "float32", "EAGLE3_INT4": "0", "EAGLE3_INT8": "1"}, lambda: True),
    "fp32 + int4 (AVX2 build)": ({"EAGLE3_DTYPE": "float32", "EAGLE3_INT4": "1", "EAGLE3_VNNI": "avx2"},
                                 lambda: vnni.builds("avx2")),
    "fp32 + int4 (VNNI build)": ({"EAGLE3_DTYPE": "float32", "EAGLE3_INT4": "1", "EAGLE3_AMX": "0"},
                                 lambda: vnni.builds("vnni")),
    "bf16 + int4 (VNNI build)": ({"EAGLE3_DTYPE": "bfloat16", "EAGLE3_INT4": "1", "EAGLE3_AMX": "0"},
                                 lambda: hardware.cpu_has_bf16() and vnni.builds("vnni")),
    "bf16 + int4 (VNNI build, 1 digit)": ({"EAGLE3_DTYPE": "bfloat16", "EAGLE3_INT4": "1", "EAGLE3_AMX": "0",
                                           "EAGLE3_VNNI_DIGITS": "1"},
                                          lambda: hardware.cpu_has_bf16() and vnni.builds("vnni")),
    "bf16 + int4 (AMX kernel)": ({"EAGLE3_DTYPE": "bfloat16", "EAGLE3_INT4": "1"}, lambda: amx.available()),
}


def serve(env, conn):
    """One format's engine in its own process (the environment decides what load_target loads, and compiled graphs of
    different formats never share a process): answers ("warm", batch) and ("decode", batch, speculative, new tokens)
    requests."""
    os.environ.update(env)
    from eagle3 import SpeculativeDecoder, load_target
    from eagle3.layers import weight_format
    from eagle3.prompts import heldout_prompts

    from .peers import batch_prompts, engine_decode, warm_prompts

    target = load_target()
    target.eos_ids = []  # every row decodes the full length
    dec = SpeculativeDecoder(target)
    prompts = [p["prompt"] for p in heldout_prompts()]
    conn.send(weight_format(target.model))
    while (msg := conn.recv()) is not None:
        batch = msg[1]
        if msg[0] == "warm":  # compiled graphs, the draft budget
            dec.warm_up(batch)
            dec.generate(warm_prompts(batch), max_new_tokens=16, batch_size=batch)
            conn.send(None)
        else:
            conn.send(engine_decode(dec, batch_prompts(prompts, batch), batch, msg[3], msg[2], dec.compiled)[0])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--formats", nargs="+", choices=list(FORMATS), default=list(FORMATS))
    ap.add_argument("--eagle", action="store_true", help="also EAGLE-3 (adaptive) in each format")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "formats.md"))
    a = ap.parse_args()
    machine = hardware.describe()
    print(machine, flush=True)
    ctx = mp.get_context("spawn")
    engines, loaded = {}, {}
    for name in a.formats:
        if not FORMATS[name][1]():
            print(f"{name}: not on this CPU", flush=True)
            continue
        parent, child = ctx.Pipe()
        ctx.Process(target=serve, args=(FORMATS[name][0], child), daemon=True).start()
        engines[name], loaded[name] = parent, parent.recv()
    kinds = [(name, False) for name in engines] + ([(name, True) for name in engines] if a.eagle else [])
    rows = []
    for batch in a.batches:
        for conn in engines.values():
            conn.send(("warm", batch))
            conn.recv()
        got = {k: [] for k in kinds}
        for rep in range(a.reps):
            for name, spec in kinds:  # one at a time: the others wait on their pipes
                engines[name].send(("decode", batch, spec, a.max_new_tokens))
                got[(name, spec)].append(engines[name].recv())
            print(f"batch {batch} rep {rep}: " + ", ".join(f"{n}{' EAGLE-3' if s else ''} {v[-1]:.1f}"
                                                          for (n, s), v in got.items()), flush=True)
        rows.append((batch, {k: statistics.median(v) for k, v in got.items()}))
    for conn in engines.values():
        conn.send(None)
    write(a, machine, loaded, kinds, rows)


def write(a, machine, loaded, kinds, rows):
    base = kinds[0]
    lines = [f"# Decode speed by weight format ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})", "",
             f"Machine: {machine}.",
             f"{a.max_new_tokens} new tokens per sequence, held-out chat prompts; decode tok/s (prefill excluded), "
             f"median of {a.reps} alternated repetitions; ratios against {base[0]}. "
             "`python -m bench.formats` wrote this file.",
             "", "Formats as loaded: " + "; ".join(f"{n}: {f}" for n, f in loaded.items()),
             "", "| batch | " + " | ".join(f"{n}{' EAGLE-3' if s else ''}" for n, s in kinds) + " |",
             "|---|" + "---|" * len(kinds)]
    for batch, med in rows:
        lines.append(f"| {batch} | " + " | ".join(
            f"{med[k]:.1f}" + ("" if k == base else f" ({med[k] / med[base]:.2f}x)") for k in kinds) + " |")
    Path(a.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

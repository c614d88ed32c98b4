"""What one forward's linears cost by weight format and row count, on this CPU: the table behind the engine's choice
of weights by hardware (eagle3/target.py load_target). Writes bench/results/linears.md.

    python -m bench.linears [--rows 1 2 4 8 16 32 64] [--reps 5]

Every layer's linears of the default target (SmolLM2-135M: 30 x qkv, o, gate_up, down; the lm_head apart) are
distinct weights run one after another, as in a forward, so they stream from memory rather than sit in cache.
Random weights and activations of the real shapes; formats whose kernel this CPU lacks are left out. Medians over
--reps passes, the formats alternated within each pass."""
import argparse
import statistics
import time
import warnings
from pathlib import Path
from unittest.mock import patch

import torch

from eagle3 import amx, hardware, int8, vnni
from eagle3.layers import Linear
from eagle3.quant import quantize_q4
from eagle3.target import load_tokenizer

ROOT = Path(__file__).resolve().parent.parent


def layer_shapes(config):
    """(in, out) of each linear of one layer, as the engine fuses them."""
    h, i, d = config.hidden_size, config.intermediate_size, config.head_dim
    qkv = (config.num_attention_heads + 2 * config.num_key_value_heads) * d
    return [(h, qkv), (config.num_attention_heads * d, h), (h, 2 * i), (i, h)]


def build(fmt, shapes, layers):
    """`layers` copies of the layer's linears in weight format `fmt` (None where this CPU cannot run it)."""
    mods = []
    for _ in range(layers):
        for k, n in shapes:
            lin = Linear(k, n)
            lin.weight.data.normal_(0, 0.05)
            if fmt == "fp32 (oneDNN)":
                lin.pack()
            elif fmt == "bf16 (oneDNN)":
                if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
                    return None
                lin.to(torch.bfloat16).pack()
            elif fmt.startswith("int4"):
                build = VNNI_BUILDS.get(fmt)
                if fmt == AMX and not amx.available() or build and not vnni.builds(build):
                    return None
                if fmt not in (VNNI_FP32, AVX2_FP32):
                    lin.to(torch.bfloat16)
                with patch.object(amx, "available", return_value=fmt == AMX), \
                        patch.object(vnni, "kind", return_value=build):  # torch's kernel or an own one
                    quantize_q4(lin)
            elif fmt.startswith("int8"):
                if not int8.supported(lin.weight):
                    return None
                lin.set_int8()
            mods.append(lin)
    return mods


# The last: fbgemm's GEMM on rows already scaled, without the per-row scaling ops that compiled steps fuse away.
KERNEL_ONLY = "int8 kernel alone (no per-row scaling ops)"
AMX = "int4 (the engine's AMX kernel, eagle3/amx.py)"
VNNI = "int4 x int8 activations (the engine's VNNI kernel, eagle3/vnni.py)"
VNNI_FP32 = "int4 x int8 activations, fp32 rows in and out (the VNNI kernel on CPUs without AVX512-BF16)"
AVX2_FP32 = "int4 x int8 activations, fp32 rows in and out (the VNNI kernel's AVX2 build, CPUs with AVX2 alone)"
VNNI_BUILDS = {VNNI: "vnni", VNNI_FP32: "vnni", AVX2_FP32: "avx2"}
FORMATS = ("fp32 (oneDNN)", "bf16 (oneDNN)", "int4 (torch's kernel)", AMX, VNNI, VNNI_FP32, AVX2_FP32,
           "int8 (fbgemm, per-row activations)", KERNEL_ONLY)


def run(mods, rows, kernel_only=False):
    dt = mods[0].weight.dtype
    if kernel_only:  # what the kernel sees: each row as two digits (eagle3/int8.py)
        xs = {k: torch.randint(-64, 65, (2 * rows, k)).to(dt) for k in {m.weight.shape[1] for m in mods}}
    else:
        xs = {k: torch.randn(rows, k).to(dt) for k in {m.weight.shape[1] for m in mods}}
    start = time.perf_counter()
    for m in mods:
        int8.mm(xs[m.weight.shape[1]], m._int8) if kernel_only else m(xs[m.weight.shape[1]])
    return time.perf_counter() - start


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "linears.md"))
    a = ap.parse_args()
    warnings.filterwarnings("ignore", message=".*quantize_per_channel.*")
    config = load_tokenizer().config
    shapes = layer_shapes(config)
    mods = {f: build(f, shapes, config.num_hidden_layers) for f in FORMATS}
    mods = {f: m for f, m in mods.items() if m is not None}
    ms = {f: {} for f in mods}
    with torch.no_grad():
        for rows in a.rows:
            for f, m in mods.items():
                run(m, rows, f == KERNEL_ONLY)  # warm-up: kernel selection and packing of activations
            times = {f: [] for f in mods}
            for _ in range(a.reps):
                for f, m in mods.items():
                    times[f].append(run(m, rows, f == KERNEL_ONLY))
            for f in mods:
                ms[f][rows] = 1e3 * statistics.median(times[f])
            print(f"{rows} rows: " + ", ".join(f"{f} {ms[f][rows]:.1f} ms" for f in mods), flush=True)
    write(a, ms, config)


def write(a, ms, config):
    lines = [f"# One forward's linears by weight format ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})", "",
             f"Machine: {hardware.describe()}.",
             f"{config.num_hidden_layers} layers x (qkv, o, gate_up, down) of the default target, lm_head apart, "
             f"distinct weights streamed in order; milliseconds per pass, median of {a.reps} alternated passes. "
             "`python -m bench.linears` wrote this file.", "",
             "| format | " + " | ".join(f"{r} rows" for r in a.rows) + " | 8 rows / 1 row |",
             "|---|" + "---|" * (len(a.rows) + 1)]
    for f, row in ms.items():
        ratio = f"{row[8] / row[1]:.2f}" if 8 in row and 1 in row else "-"
        lines.append(f"| {f} | " + " | ".join(f"{row[r]:.1f}" for r in a.rows) + f" | {ratio} |")
    Path(a.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

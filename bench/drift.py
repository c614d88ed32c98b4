"""How far each engine dtype's greedy output drifts from the fp32 reference, on the held-out prompts: tokens until
the first divergence. Writes bench/results/drift.md.

    python -m bench.drift [--prompts 32] [--max-new-tokens 64] [--skip "bf16 dense" ...]

The fp32 reference computes the GGUF's weights exactly (Q4_1 dequantised in fp32). The reduced dtypes change the
numbers, not the algorithm: each one's speculative output is token-identical to its own vanilla decode (the tests),
but not necessarily to fp32's."""
import argparse
import statistics
import time
from pathlib import Path

from eagle3 import SpeculativeDecoder, hardware, load_target
from eagle3.prompts import heldout_prompts

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = {"fp32 (reference)": dict(dtype="float32", int4=False), "bf16 dense": dict(dtype="bfloat16", int4=False),
           "bf16 + int4 (GGUF Q4_1)": dict(dtype="bfloat16", int4=True),
           "fp32 + int8 (fbgemm, per-row activations)": dict(dtype="float32", int4=False, int8=True)}


def first_divergence(a, b):
    """Index of the first differing token, or the shorter length when one is a prefix of the other (None: equal)."""
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--skip", nargs="*", default=[], choices=[c for c in CONFIGS if c != "fp32 (reference)"],
                    help="engines to leave out (dense bf16 is emulated, and slow, on an AVX2-only CPU)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "drift.md"))
    a = ap.parse_args()
    prompts = [p["prompt"] for p in heldout_prompts()[: a.prompts]]
    outputs = {}
    for name, kw in CONFIGS.items():
        if name in a.skip:
            continue
        dec = SpeculativeDecoder(load_target(**kw))
        outputs[name] = [r.token_ids for r in dec.generate(prompts, a.max_new_tokens, speculative=False, batch_size=8)]
        print(f"decoded {name}", flush=True)
    ref = outputs["fp32 (reference)"]
    lines = [f"# Greedy drift from the fp32 reference ({time.strftime('%Y-%m-%d', time.gmtime())})", "",
             f"Machine: {hardware.describe()}. {len(prompts)} held-out prompts, up to {a.max_new_tokens} new tokens, "
             "vanilla greedy decoding at batch 8. `python -m bench.drift` wrote this file.", "",
             "| engine | identical to fp32 | diverged | median first divergence (diverged outputs) | min |",
             "|---|---|---|---|---|"]
    for name, outs in outputs.items():
        if outs is ref:
            continue
        div = [d for d in (first_divergence(x, y) for x, y in zip(outs, ref)) if d is not None]
        med = f"token {statistics.median(div):.0f}" if div else "-"
        lines.append(f"| {name} | {len(outs) - len(div)}/{len(outs)} | {len(div)} | {med} | {min(div) if div else '-'} |")
    Path(a.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

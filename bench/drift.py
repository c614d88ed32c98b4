"""How far each engine dtype's greedy output drifts from the fp32 reference, on the held-out prompts: tokens until
the first divergence, and how often its top-1 choice matches fp32's along fp32's own output (teacher-forced, the
"same top" statistic of llama.cpp's llama-perplexity --kl-divergence). Writes bench/results/drift.md.

    python -m bench.drift [--prompts 32] [--max-new-tokens 64] [--skip "bf16 dense" ...]

The fp32 reference computes the GGUF's weights exactly (Q4_1 dequantised in fp32). The reduced dtypes change the
numbers, not the algorithm: each one's speculative output is token-identical to its own vanilla decode (the tests),
but not necessarily to fp32's."""
import argparse
import statistics
import time
from pathlib import Path
from unittest.mock import patch

from eagle3 import SpeculativeDecoder, amx, hardware, load_target, vnni
from eagle3.layers import weight_format
from eagle3.prompts import heldout_prompts
from eagle3.target import pad_prompts

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = {"fp32 (reference)": dict(dtype="float32", int4=False), "bf16 dense": dict(dtype="bfloat16", int4=False),
           "bf16 + int4 (GGUF Q4_1)": dict(dtype="bfloat16", int4=True),
           "bf16 + int4 (GGUF Q4_1), torch's kernel": dict(dtype="bfloat16", int4=True, own_kernel=False),
           "fp32 + int4 (GGUF Q4_1)": dict(dtype="float32", int4=True),  # the VNNI kernel where it runs
           "fp32 + int8 (fbgemm, per-row activations)": dict(dtype="float32", int4=False, int8=True)}


def first_divergence(a, b):
    """Index of the first differing token, or the shorter length when one is a prefix of the other (None: equal)."""
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def top1_along(target, prompts, outputs, batch=8):
    """The target's greedy choice at each position of `outputs` (after prompt + output[:i], its choice for token i),
    one prefill per batch of prompts: [[choice for each output token] per prompt]."""
    choices = []
    for i in range(0, len(prompts), batch):
        ids = [target.encode_prompt(p) for p in prompts[i: i + batch]]
        outs = outputs[i: i + batch]
        tokens, lens, pos, mask = pad_prompts([x + o[:-1] for x, o in zip(ids, outs)], target.device)
        logits, _ = target.model(tokens, pos, target.model.new_cache(len(ids), tokens.shape[1] + 1), mask)
        top = logits.argmax(-1)
        choices += [top[b, len(x) - 1: len(x) - 1 + len(o)].tolist() for b, (x, o) in enumerate(zip(ids, outs))]
    return choices


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--skip", nargs="*", default=[], choices=[c for c in CONFIGS if c != "fp32 (reference)"],
                    help="engines to leave out (dense bf16 is emulated, and slow, on an AVX2-only CPU)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "drift.md"))
    a = ap.parse_args()
    prompts = [p["prompt"] for p in heldout_prompts()[: a.prompts]]
    outputs, top1 = {}, {}
    for name, kw in CONFIGS.items():
        if name in a.skip:
            continue
        kw = dict(kw)
        own = kw.pop("own_kernel", True)  # False: torch's int4 kernel where the engine has its own (amx, vnni)
        with patch.object(amx, "available", amx.available if own else lambda: False), \
                patch.object(vnni, "available", vnni.available if own else lambda: False):
            target = load_target(**kw)
        dec = SpeculativeDecoder(target)
        name = f"{name} [{weight_format(target.model)}]" if "int4" in name else name
        outputs[name] = [r.token_ids for r in dec.generate(prompts, a.max_new_tokens, speculative=False, batch_size=8)]
        top1[name] = top1_along(dec.target, prompts, outputs["fp32 (reference)"])
        print(f"decoded {name}", flush=True)
    ref, ref_top1 = outputs["fp32 (reference)"], sum(top1["fp32 (reference)"], [])
    lines = [f"# Greedy drift from the fp32 reference ({time.strftime('%Y-%m-%d', time.gmtime())})", "",
             f"Machine: {hardware.describe()}. {len(prompts)} held-out prompts, up to {a.max_new_tokens} new tokens, "
             "vanilla greedy decoding at batch 8. `python -m bench.drift` wrote this file.", "",
             "Top-1 agreement: the engine's greedy choice at each position of fp32's own outputs (teacher-forced) "
             "matches fp32's.", "",
             "| engine | identical to fp32 | diverged | median first divergence (diverged outputs) | min "
             "| top-1 agreement |", "|---|---|---|---|---|---|"]
    for name, outs in outputs.items():
        if outs is ref:
            continue
        div = [d for d in (first_divergence(x, y) for x, y in zip(outs, ref)) if d is not None]
        med = f"token {statistics.median(div):.0f}" if div else "-"
        same = sum(x == y for x, y in zip(sum(top1[name], []), ref_top1)) / len(ref_top1)
        lines.append(f"| {name} | {len(outs) - len(div)}/{len(outs)} | {len(div)} | {med} | {min(div) if div else '-'} "
                     f"| {same:.1%} |")
    Path(a.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

"""t(K): cost of one target forward over K new tokens at context C, for the fp32 engine (oneDNN-packed and plain
torch GEMM) and for Hugging Face transformers, side by side in one run.

    python -m bench.engine [--context 200] [--reps 10]
"""
import argparse
import statistics
import time

import torch

from eagle3.layers import pack_linears
from eagle3.target import DEFAULT_TARGET, cache_dir, load_target

KS = (1, 2, 4, 8, 16, 32)


def _median_ms(fn, reps):
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def engine_times(model, context, reps):
    out = {}
    dev = model.embed_tokens.weight.device
    cache = model.new_cache(1, context + max(KS) + 1)
    prompt = torch.randint(0, model.config.vocab_size, (1, context), device=dev)
    model(prompt, torch.arange(context, device=dev)[None], cache,
          torch.ones(context, context, dtype=torch.bool, device=dev).tril()[None], logits_at=torch.tensor([[context - 1]]))
    cache.lens[:] = context
    for k in KS:
        toks = torch.randint(0, model.config.vocab_size, (1, k), device=dev)
        pos = context + torch.arange(k, device=dev)[None]
        mask = torch.ones(k, k, dtype=torch.bool, device=dev).tril()[None]  # a chain: same cost as any tree of k
        out[k] = _median_ms(lambda: model(toks, pos, cache, mask), reps)
    return out


def hf_times(context, reps):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(cache_dir() / DEFAULT_TARGET, dtype=torch.float32).eval()
    prompt = torch.randint(0, hf.config.vocab_size, (1, context))
    out = {}
    with torch.no_grad():
        base = hf(prompt, use_cache=True).past_key_values
        for k in KS:
            toks = torch.randint(0, hf.config.vocab_size, (1, k))

            def step(toks=toks, k=k):
                hf(toks, past_key_values=base, use_cache=True)
                base.crop(-k)  # back to the context (cheap: a slice)

            out[k] = _median_ms(step, reps)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--context", type=int, default=200)
    ap.add_argument("--reps", type=int, default=10)
    a = ap.parse_args()
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, context {a.context}", flush=True)
    target = load_target(DEFAULT_TARGET, dtype="float32", int4=False)  # what it compares: fp32 GEMM layouts vs HF
    rows = {"engine (oneDNN packed)": engine_times(target.model, a.context, a.reps)}
    print("measured engine (packed)", flush=True)
    pack_linears(target.model, on=False)
    rows["engine (torch default GEMM)"] = engine_times(target.model, a.context, a.reps)
    print("measured engine (unpacked)", flush=True)
    rows["HF transformers"] = hf_times(a.context, a.reps)
    print("\n| forward | " + " | ".join(f"t({k}) ms" for k in KS) + " | t(8)/t(1) | t(16)/t(1) |")
    print("|---|" + "---|" * (len(KS) + 2))
    for name, t in rows.items():
        print(f"| {name} | " + " | ".join(f"{t[k]:.1f}" for k in KS) + f" | {t[8] / t[1]:.2f} | {t[16] / t[1]:.2f} |")


if __name__ == "__main__":
    main()

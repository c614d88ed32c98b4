"""GPU benchmark, prepared to run as one short script on a lent GPU (bench/gpu.sh): the engine's t(K) (one target
forward over K new tokens) and vanilla vs EAGLE-3 decode at batch 1, 8, 32 and 64, side by side, with tau.

    python -m bench.gpu [--device cuda] [--target smollm2-135m-instruct] [--max-new-tokens 128] [--quick]

--device cpu --target tiny --quick runs the same code on a CPU in seconds (CI does, so the script cannot rot)."""
import argparse
import statistics
import time

import torch

from eagle3 import SpeculativeDecoder, hardware, load_target
from eagle3.prompts import heldout_prompts

from .peers import batch_prompts

KS = (1, 2, 4, 8, 16, 32, 64)


def sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def forward_ms(model, device, k, context=200, reps=20):
    """Median time of one forward over k new tokens after `context` cached ones (a chain: any tree of k costs the same)."""
    cache = model.new_cache(1, context + k + 1)
    ones = lambda n: torch.ones(n, n, dtype=torch.bool, device=device).tril()[None]  # noqa: E731
    model(torch.randint(0, model.config.vocab_size, (1, context), device=device),
          torch.arange(context, device=device)[None], cache, ones(context))
    cache.lens[:] = context
    toks = torch.randint(0, model.config.vocab_size, (1, k), device=device)
    pos = context + torch.arange(k, device=device)[None]
    times = []
    for _ in range(reps + 3):
        sync(device)
        t = time.perf_counter()
        model(toks, pos, cache, ones(k))
        sync(device)
        times.append(time.perf_counter() - t)
    return statistics.median(times[3:]) * 1e3


def decode(dec, prompts, batch, new_tokens, speculative):
    sync(dec.target.device)
    res = dec.generate(prompts, max_new_tokens=new_tokens, batch_size=batch, speculative=speculative)
    sync(dec.target.device)
    s = dec.last_stats
    return s["tokens_per_s"], s["accept_length"], [r.token_ids for r in res]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--target", default="smollm2-135m-instruct")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 64])
    ap.add_argument("--dtype", default=None, help="default: by hardware (bf16 on CUDA)")
    ap.add_argument("--quick", action="store_true", help="a few tokens and repetitions: checks the code path only")
    a = ap.parse_args()
    new_tokens, reps = (8, 2) if a.quick else (a.max_new_tokens, 20)
    print(hardware.describe(), flush=True)
    target = load_target(a.target, device=a.device, dtype=a.dtype)
    print(f"target {target.name} on {a.device}, {target.model.embed_tokens.weight.dtype}", flush=True)
    print("| K | " + " | ".join(str(k) for k in KS) + " |\n|---|" + "---|" * len(KS))
    print("| t(K) ms | " + " | ".join(f"{forward_ms(target.model, a.device, k, reps=reps):.2f}" for k in KS) + " |")
    dec = SpeculativeDecoder(target)
    prompts = [p["prompt"] for p in heldout_prompts()]
    print("\n| batch | vanilla tok/s | EAGLE-3 tok/s | tau | speedup | identical |\n|---|---|---|---|---|---|", flush=True)
    for batch in a.batches:
        ps = batch_prompts(prompts, batch)
        decode(dec, ps[:batch], batch, 8, True)  # warm-up: kernels, allocator, the draft budget's calibration
        v, _, vids = decode(dec, ps, batch, new_tokens, False)
        e, tau, eids = decode(dec, ps, batch, new_tokens, True)
        print(f"| {batch} | {v:.1f} | {e:.1f} | {tau:.2f} | {e / v:.2f}x | {sum(x == y for x, y in zip(vids, eids))}/{len(ps)} |",
              flush=True)


if __name__ == "__main__":
    main()

"""Held-out evaluation of the draft head: tau, acceptance rate per depth, and tokens/s of EAGLE-3 vs the same
engine's vanilla decode vs Hugging Face generate(), side by side in one run (ratios; the machine is noisy). EAGLE-3
runs the one configured tree (adaptive=False) so tau and per-depth rates describe the head; bench.report measures
the adaptive decoder the worker uses.

    python -m bench.acceptance [--set template|freeform] [--prompts 84] [--max-new-tokens 96] [--batch 1 8]
                               [--temps 0 0.7] [--out FILE] [--drafter eagle|suffix|hybrid]

--set template (default): the held-out topics with the training set's templates (eagle3/prompts.py);
--set freeform: hand-written free-form prompts and chats (bench/prompts/freeform.jsonl), unlike any template.
"""
import argparse
import functools
import statistics
import time

import torch

from eagle3 import SpeculativeDecoder, load_target
from eagle3.prompts import evaluation_prompts
from eagle3.target import DEFAULT_TARGET, cache_dir


@functools.cache
def _hf_model():
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(cache_dir() / DEFAULT_TARGET, dtype=torch.float32).eval()


def hf_generate(prompts, target, max_new_tokens, batch, prompt_lookup=None):
    """tokens/s of transformers' own greedy generate() on the same prompts (batched with left padding);
    prompt_lookup: n-gram candidate tokens for HF's prompt-lookup decoding (HF runs it at batch 1 only)."""
    hf = _hf_model()
    extra = dict(prompt_lookup_num_tokens=prompt_lookup) if prompt_lookup else {}
    eos = target.eos_ids[0]
    new = 0
    t0 = time.perf_counter()
    for i in range(0, len(prompts), batch):
        ids = [target.encode_prompt(p) for p in prompts[i: i + batch]]
        L = max(map(len, ids))
        x = torch.tensor([[eos] * (L - len(r)) + r for r in ids])
        att = torch.tensor([[0] * (L - len(r)) + [1] * len(r) for r in ids])
        with torch.no_grad():
            out = hf.generate(x, attention_mask=att, max_new_tokens=max_new_tokens, do_sample=False,
                              pad_token_id=eos, eos_token_id=eos, **extra)
        for row in out[:, L:].tolist():
            new += row.index(eos) if eos in row else len(row)
    return new / (time.perf_counter() - t0)


def depth_rates(hist):
    """P(a round accepts >= d drafted tokens | it accepted >= d-1), d = 1..depth, from rounds by emitted length."""
    rates = []
    for d in range(1, len(hist)):
        reached = sum(hist[d - 1:])
        rates.append(sum(hist[d:]) / reached if reached else 0.0)
    return rates


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--set", default="template", choices=["template", "freeform"], help="which held-out set")
    ap.add_argument("--prompts", type=int, help="use the first N prompts of the set (default: all)")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--temps", type=float, nargs="+", default=[0.0, 0.7])
    ap.add_argument("--draft", help="head directory (default: the shipped head)")
    ap.add_argument("--parallel-degree", type=int, default=4)
    ap.add_argument("--depth", type=int, default=5)
    ap.add_argument("--total-tokens", type=int, default=16)
    ap.add_argument("--drafter", default="eagle", help="eagle, suffix or hybrid (eagle3/drafters)")
    ap.add_argument("--no-hf", action="store_true")
    ap.add_argument("--out", help="also write the markdown table here")
    a = ap.parse_args()
    target = load_target()
    dec = SpeculativeDecoder(target, draft=a.draft, parallel_degree=a.parallel_degree, depth=a.depth,
                             total_tokens=a.total_tokens, adaptive=False, drafter=a.drafter)  # one fixed tree
    prompts = [p["prompt"] for p in evaluation_prompts(a.set)][: a.prompts]
    lines = [f"held-out prompts ({a.set}): {len(prompts)}, max_new_tokens {a.max_new_tokens}, drafter {a.drafter}, "
             f"tree k={dec.k} depth={dec.depth} nodes={dec.total_tokens}, draft vocab {dec.head.config.draft_vocab_size}, "
             f"torch threads {torch.get_num_threads()}", "",
             "| temp | batch | decoder | tau mean | tau median | accept rate by depth | tok/s | x vanilla | x HF | identical |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for temp in a.temps:
        for b in a.batch:
            print(f"temp {temp} batch {b}: vanilla ...", flush=True)
            van = dec.generate(prompts, a.max_new_tokens, temperature=temp, batch_size=b, speculative=False, seed=0)
            vs = dec.last_stats
            print(f"temp {temp} batch {b}: eagle-3 ...", flush=True)
            sp = dec.generate(prompts, a.max_new_tokens, temperature=temp, batch_size=b, seed=0)
            ss = dec.last_stats
            hf = None
            if temp == 0 and not a.no_hf:
                print(f"temp {temp} batch {b}: HF generate ...", flush=True)
                hf = hf_generate(prompts, target, a.max_new_tokens, b)
            taus = [r.stats["accept_length"] for r in sp]
            same = f"{sum(x.token_ids == y.token_ids for x, y in zip(van, sp))}/{len(prompts)}" if temp == 0 else "-"
            v_tps, s_tps = vs["tokens_per_s"], ss["tokens_per_s"]
            x_hf = (lambda tps: f"{tps / hf:.2f}") if hf else (lambda tps: "-")
            row = lambda name, tau, med, rates, tps, ident: lines.append(  # noqa: E731
                f"| {temp} | {b} | {name} | {tau} | {med} | {rates} | {tps:.1f} | {tps / v_tps:.2f} | {x_hf(tps)} | {ident} |")
            row("vanilla (engine)", "1.00", "1.00", "-", v_tps, "-")
            if hf:
                row("HF generate()", "1.00", "1.00", "-", hf, "-")
            row("EAGLE-3", f"{ss['accept_length']:.2f}", f"{statistics.median(taus):.2f}",
                "/".join(f"{r:.2f}" for r in depth_rates(ss["accept_hist"])), s_tps, same)
            print("\n".join(lines[-3:]), flush=True)
    text = "\n".join(lines)
    print("\n" + text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()

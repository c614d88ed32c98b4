"""Draft-vocabulary sweep: the shipped head restricted to its K most frequent tokens, K = 8192 / 4096 / 2048 ...,
side by side in one run on the held-out prompts (greedy, batch 1, the fixed default tree).

    python -m bench.vocab [--sizes 8192 4096 2048 1024] [--count-prompts 256] [--prompts 32] [--max-new-tokens 48]

Token frequencies come from the target's own greedy answers to training prompts (the same statistic the training
used to pick the vocabulary). Restricting a trained head keeps its other weights, so a smaller vocabulary here
only loses the drafts of the dropped tokens; a head trained at that size would also spend no capacity on them.
It answers the question the sweep is for: is a smaller lm_head faster at (nearly) equal tau on this machine?"""
import argparse
import dataclasses
import statistics
import sys

import torch

from eagle3 import SpeculativeDecoder, load_target
from eagle3.decoder import default_head_path
from eagle3.draft import Eagle3Head
from eagle3.prompts import heldout_prompts, training_prompts


def token_counts(dec, prompts, max_new_tokens, log):
    counts = torch.zeros(dec.target.config.vocab_size, dtype=torch.long)
    for i in range(0, len(prompts), 64):
        for r in dec.generate(prompts[i:i + 64], max_new_tokens, batch_size=32, speculative=False):
            counts += torch.bincount(torch.tensor(r.token_ids), minlength=counts.numel())
        log(f"  counted answers to {min(i + 64, len(prompts))}/{len(prompts)} prompts ({int(counts.sum())} tokens)")
    return counts


def restrict(head: Eagle3Head, counts, size):
    """A copy of head whose lm_head keeps only the `size` draft tokens most frequent in counts."""
    ids = head.to_target_ids(torch.arange(head.config.draft_vocab_size))
    keep = counts[ids].topk(size).indices.sort().values  # draft rows, in target-id order
    small = Eagle3Head(dataclasses.replace(head.config, draft_vocab_size=size))
    sd = {k: v for k, v in head.state_dict().items() if k not in ("d2t", "t2d")}
    sd["lm_head.weight"] = sd["lm_head.weight"][keep]
    small.load_state_dict(sd, strict=False)
    small.set_vocab(ids[keep])
    return small.eval()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[8192, 4096, 2048, 1024])
    ap.add_argument("--count-prompts", type=int, default=256)
    ap.add_argument("--count-tokens", type=int, default=128)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--out", help="also write the markdown table here")
    a = ap.parse_args()
    log = lambda *x: print(*x, file=sys.stderr, flush=True)  # noqa: E731
    target = load_target()
    full = Eagle3Head.from_pretrained(default_head_path(target))
    sizes = [s for s in a.sizes if s <= full.config.draft_vocab_size]
    base = SpeculativeDecoder(target, adaptive=False)  # the shipped head (packed: `full` stays as loaded)
    log(f"counting tokens of the target's answers to {a.count_prompts} training prompts")
    counts = token_counts(base, [p["prompt"] for p in training_prompts()][: a.count_prompts], a.count_tokens, log)
    prompts = [p["prompt"] for p in heldout_prompts()][: a.prompts]
    log("vanilla")
    van = base.generate(prompts, a.max_new_tokens, batch_size=1, speculative=False)
    v_tps = base.last_stats["tokens_per_s"]
    ranked = counts.sort(descending=True).values
    lines = [f"`python -m bench.vocab` — {len(prompts)} held-out prompts, {a.max_new_tokens} new tokens, greedy, "
             f"batch 1, tree k={base.k} depth={base.depth} nodes={base.total_tokens}, {torch.get_num_threads()} torch "
             f"threads; frequencies from {int(counts.sum())} answer tokens of {a.count_prompts} training prompts. "
             "One run, side by side.", "",
             "| draft vocab | covers (answer tokens) | tau mean | tau median | draft s | verify s | tok/s | × vanilla | identical |",
             "|---|---|---|---|---|---|---|---|---|"]
    for size in sizes:
        log(f"draft vocab {size}")
        dec = SpeculativeDecoder(target, draft=restrict(full, counts, size), adaptive=False)
        out = dec.generate(prompts, a.max_new_tokens, batch_size=1)
        s = dec.last_stats
        ids = dec.head.to_target_ids(torch.arange(size))
        cover = float(counts[ids].sum() / counts.sum())
        same = sum(x.token_ids == y.token_ids for x, y in zip(out, van))
        lines.append(f"| {size} | {cover:.1%} | {s['accept_length']:.2f} | "
                     f"{statistics.median(r.stats['accept_length'] for r in out):.2f} | {s['draft_time_s']:.1f} | "
                     f"{s['verify_time_s']:.1f} | {s['tokens_per_s']:.1f} | {s['tokens_per_s'] / v_tps:.2f} | "
                     f"{same}/{len(prompts)} |")
        log(lines[-1])
    lines += ["", f"Vanilla (engine): {v_tps:.1f} tok/s. The most frequent {sizes[-1]} tokens of all "
              f"{target.config.vocab_size} cover {float(ranked[:sizes[-1]].sum() / counts.sum()):.1%} of the answers."]
    text = "\n".join(lines)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()

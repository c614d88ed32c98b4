"""Row chunks vs the int4 kernel: the engine's vanilla decode and a fixed 4-node EAGLE-3 tree with the target's int4
layers computed by the int4 kernel (row chunks off) or as dense bf16 GEMMs in calls of R rows (layers.row_chunks),
side by side, alternated, at several batch sizes; every output checked against the vanilla decode of the same
mode. Writes bench/results/row_chunks.md with the CPU flags.

    python -m bench.rowchunks [--batch 8 16 32 64] [--chunks 0 32 64] [--prompts 64] [--max-new-tokens 48]
                              [--chunk-from B]

--chunk-from B: only calls of batch >= B use the chunks (their prefills, steps and verify forwards; default 1: every
call), as hardware.ROW_CHUNK_FROM decides in the engine.
"""
import argparse
import sys
import time
from pathlib import Path

from eagle3 import SpeculativeDecoder, hardware, load_target
from eagle3.prompts import heldout_prompts

OUT = Path(__file__).resolve().parent / "results" / "row_chunks.md"


def run(dec, prompts, batch, max_new, chunk, speculative):
    dec.row_chunk = chunk or None
    out = dec.generate(prompts, max_new, batch_size=batch, speculative=speculative)
    return dec.last_stats["new_tokens"], dec.last_stats["wall_time_s"], [r.token_ids for r in out]


def prefill_s(dec, prompts, batch, chunk):
    """The prefills' share of a call: the same call's wall time with one new token (as bench.peers measures)."""
    return run(dec, prompts, batch, 1, chunk, False)[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, nargs="+", default=[8, 16, 32, 64])
    ap.add_argument("--chunks", type=int, nargs="+", default=[0, 32, 64], help="rows per GEMM call; 0 = int4 kernel")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--chunk-from", type=int, default=1, help="batch size from which calls use the chunks")
    ap.add_argument("--out", default=str(OUT))
    a = ap.parse_args()
    target = load_target()
    dec = SpeculativeDecoder(target, adaptive=False, parallel_degree=2, depth=3, total_tokens=4)
    hardware.ROW_CHUNK_FROM = a.chunk_from  # calls of this batch size or more use the chunks
    prompts = [p["prompt"] for p in heldout_prompts(a.prompts)]
    lines = ["# Row chunks vs the int4 kernel", "", f"`python -m bench.rowchunks {' '.join(sys.argv[1:])}` — "
             f"{time.strftime('%Y-%m-%d')}. Machine: {hardware.describe()}. {a.prompts} held-out prompts, "
             f"{a.max_new_tokens} new tokens max, greedy, {a.reps} alternated reps, calls chunked from batch "
             f"{a.chunk_from}. Tree: fixed, k 2, depth 3, 4 nodes. 'with prefill': new tokens / the call's wall "
             "time; 'decode': the tokens after each prompt's first / (wall time - the same call's with one new token), "
             "as bench.peers counts (dense chunks win most in prefills, so the two can disagree). 'identical': "
             "speculative outputs token-identical to the vanilla decode of the same mode.", "",
             "| batch | rows per GEMM call | vanilla tok/s with prefill | vanilla decode tok/s | 4-node tree tok/s with "
             "prefill | 4-node tree decode tok/s | identical |", "|---|---|---|---|---|---|---|"]
    for batch in a.batch:
        tot = {}
        for chunk in a.chunks:  # warm-up: compiled steps' first shapes, oneDNN's first calls
            for spec in (False, True):
                run(dec, prompts[: 2 * batch], batch, 8, chunk, spec)
        for rep in range(a.reps):
            for chunk in a.chunks[rep % len(a.chunks):] + a.chunks[: rep % len(a.chunks)]:  # rotate the order each rep
                pre = prefill_s(dec, prompts, batch, chunk)
                for spec in (False, True):
                    n, s, ids = run(dec, prompts, batch, a.max_new_tokens, chunk, spec)
                    t = tot.setdefault((chunk, spec), [0, 0.0, ids, 0.0])
                    t[0] += n
                    t[1] += s
                    t[3] += pre
        for chunk in a.chunks:
            (vn, vs, vids, vp), (sn, ss, sids, sp) = tot[(chunk, False)], tot[(chunk, True)]
            same = sum(x == y for x, y in zip(sids, vids))
            first = len(prompts) * a.reps  # each prompt's first token comes with its prefill
            lines.append(f"| {batch} | {chunk or 'int4 kernel'} | {vn / vs:.1f} | {(vn - first) / (vs - vp):.1f} | "
                         f"{sn / ss:.1f} | {(sn - first) / (ss - sp):.1f} | {same}/{len(vids)} |")
            print(lines[-1], file=sys.stderr, flush=True)
    Path(a.out).write_text("\n".join(lines + [""]))
    print("\n".join(lines))


if __name__ == "__main__":
    main()

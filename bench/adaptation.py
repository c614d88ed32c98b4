"""Workload adaptation, measured (#18): does `eagle3.adapt` on N completed items of one workload style raise τ on
*unseen* items of that style?

One style is one bulk job as users send them: a fixed instruction over many different inputs. The items come from
real texts on this machine (eagle3/sources.py readers), never from the head's training templates:

    explain-code   "Explain what this Python function does ..." over standard-library functions
    summarise      "Summarise the following text in two sentences." over /usr/share/doc and man-page passages

    python -m bench.adaptation [--style explain-code] [--items 2000] [--unseen 100] [--epochs 2] [--lr 3e-4]

Steps: (1) decode every item with the engine's vanilla greedy decode at batch 32, which is what a worker stores
for a greedy item (speculation is lossless), cached under --work so a rerun resumes; (2) `eagle3.adapt.adapt` on
the first --items of them, exactly as `python -m eagle3.adapt --job ID` runs (its gate holds out --heldout of
those); (3) τ of the general head and of the adapted one, fixed tree, batch 1, greedy, on the --unseen items that
adaptation never saw, and whether both decodes equal the engine's vanilla decode at batch 1. Heads are versioned
under a temporary EAGLE3_MODELS_DIR, so the repository's shipped head is never replaced. Writes
bench/results/adaptation.md.
"""
import argparse
import json
import os
import random
import shutil
import tempfile
import time
from pathlib import Path

from tqdm import tqdm

from eagle3 import SpeculativeDecoder, hardware, heads, load_target
from eagle3.sources import SOURCE_FILES

OUT = Path(__file__).resolve().parent / "results" / "adaptation.md"

# style: (text sources, material kind, the job's one instruction, the longest input in characters)
STYLES = {
    "explain-code": (("stdlib",), "code", "Explain what this Python function does in two or three sentences."
                                          "\n\n```python\n{text}\n```", 900),
    "summarise": (("docs", "man"), "prose",
                  "Summarise the following text in two sentences.\n\n{text}", 900),
}


def style_prompts(style, n, seed=0):
    """n distinct prompts of one style, deterministic given the seed and the files on disk."""
    sources, kind, instruction, longest = STYLES[style]
    rng = random.Random(f"{style}-{seed}")
    out, seen = [], set()
    for source in sources:
        list_files, material, _ = SOURCE_FILES[source]
        files = list_files()
        rng.shuffle(files)
        for path in files:
            for m in material(path, random.Random(f"{seed}-{path}"))[:8]:  # a few per file: spread over many files
                text = m.text.strip()
                if m.kind in (kind, "manual") and len(text) <= longest and text not in seen:
                    seen.add(text)
                    out.append(instruction.format(text=text))
            if len(out) >= n * len(sources) and len(out) >= n:
                break
    rng.shuffle(out)
    if len(out) < n:
        raise SystemExit(f"style {style}: only {len(out)} distinct inputs on this machine, {n} asked")
    return out[:n]


def complete(target, prompts, path, batch=32, max_new_tokens=64):
    """Vanilla greedy outputs of every prompt, appended to `path` (JSONL) batch by batch, resumable."""
    done = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    dec = SpeculativeDecoder(target)
    with path.open("a") as f, tqdm(total=len(prompts), initial=len(done), desc="completing items", unit="item") as bar:
        for i in range(len(done), len(prompts), batch):
            chunk = prompts[i: i + batch]
            ids = [target.encode_prompt(p) for p in chunk]
            for j, (p, r) in enumerate(zip(ids, dec.generate_ids(ids, max_new_tokens, batch_size=batch,
                                                                 speculative=False))):
                row = dict(item_id=i + j, prompt_ids=p, output_ids=r.token_ids)
                f.write(json.dumps(row) + "\n")
                done.append(row)
            f.flush()
            bar.update(len(chunk))
    return done


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--style", default="explain-code", choices=sorted(STYLES))
    ap.add_argument("--items", type=int, default=2000, help="completed items given to eagle3.adapt")
    ap.add_argument("--unseen", type=int, default=100, help="items of the same style adaptation never sees")
    ap.add_argument("--epochs", type=float, default=2.0)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--heldout", type=float, default=0.05, help="share of --items the gate holds out")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--work", default="runs/adaptation", help="cache of completed items (resumable)")
    a = ap.parse_args()
    from eagle3 import adapt  # after argparse: --help stays light

    started = time.time()
    target = load_target()
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    prompts = style_prompts(a.style, a.items + a.unseen)
    rows = complete(target, prompts, work / f"{a.style}-{a.items + a.unseen}.jsonl", max_new_tokens=a.max_new_tokens)
    examples = [adapt.Example(r["item_id"], r["prompt_ids"], r["output_ids"]) for r in rows]
    train, unseen = examples[: a.items], examples[a.items:]
    completed_s = time.time() - started

    # A scratch copy of the shipped head as version 0: adaptation installs its versions there, not in models/.
    scratch = Path(tempfile.mkdtemp(prefix="adapt-bench-"))
    shutil.copytree(heads.head_root(target.name), scratch / heads.head_root(target.name).name,
                    ignore=shutil.ignore_patterns("versions", heads.POINTER))
    os.environ["EAGLE3_MODELS_DIR"] = str(scratch)
    report = adapt.adapt(target, train, epochs=a.epochs, lr=a.lr, heldout_share=a.heldout,
                         eval_tokens=a.max_new_tokens, log=tqdm.write)
    general = adapt.load_head(target, 0)
    tau_general, out_general = adapt.measure_tau(target, general, unseen, a.max_new_tokens)
    row = dict(style=a.style, items=a.items, unseen=len(unseen), epochs=a.epochs, lr=a.lr, steps=report.steps,
               train_tokens=report.train_tokens, gate_general=report.tau_current, gate_adapted=report.tau_candidate,
               installed=report.installed, unseen_general=tau_general, completed_s=completed_s,
               adapt_s=report.wall_s)
    # Lossless: each head's decode equals the vanilla decode at the same batch size (1). The stored outputs came
    # from batch 32, whose forwards compute in another mode on some CPUs (row chunks), so they are not the reference.
    dec = SpeculativeDecoder(target)
    want = [dec.generate_ids([ex.prompt_ids], max(1, min(a.max_new_tokens, len(ex.output_ids))), batch_size=1,
                             speculative=False)[0].token_ids for ex in unseen]  # measure_tau's limits
    row["identical_general"] = sum(o == w for o, w in zip(out_general, want))
    if report.installed:
        adapted = adapt.load_head(target, report.version)
        tau_adapted, out_adapted = adapt.measure_tau(target, adapted, unseen, a.max_new_tokens)
        row.update(unseen_adapted=tau_adapted, identical_adapted=sum(o == w for o, w in zip(out_adapted, want)))
    row["wall_s"] = time.time() - started - completed_s  # adaptation and evaluation only
    print(json.dumps(row))
    write(row)
    shutil.rmtree(scratch)


def write(row):
    """Append one run's row to bench/results/adaptation.md (the table keeps every run, with its machine)."""
    header = ("# Workload adaptation\n\n`python -m bench.adaptation` — τ = tokens per draft/verify round, fixed tree "
              "(k4, depth 5, 16 nodes), batch 1, greedy. 'gate' = eagle3.adapt's own held-out slice of the items it "
              "was given; 'unseen' = items of the same style it never saw. 'identical' = each head's decodes equal to "
              "the engine's vanilla decode at batch 1. 'wall' excludes completing the items (cached under --work)."
              "\n\n| date | machine | style | items | epochs | lr | steps | gate τ general → adapted | installed | "
              "unseen τ general | unseen τ adapted | gain | identical | wall |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    adapted = row.get("unseen_adapted")
    gain = f"{adapted - row['unseen_general']:+.2f}" if adapted is not None else "-"
    line = (f"| {time.strftime('%Y-%m-%d')} | {hardware.describe()} | {row['style']} | {row['items']} "
            f"| {row['epochs']} | {row['lr']} | {row['steps']} | "
            f"{row['gate_general']:.2f} → {row['gate_adapted']:.2f} | "
            f"{'yes' if row['installed'] else 'no'} | {row['unseen_general']:.2f} | "
            f"{f'{adapted:.2f}' if adapted is not None else '-'} | {gain} | "
            f"{row['identical_general']}/{row['unseen']}, {row.get('identical_adapted', '-')}/{row['unseen']} | "
            f"{row['wall_s'] / 60:.0f} min |\n")
    OUT.write_text((OUT.read_text() if OUT.exists() else header) + line)


if __name__ == "__main__":
    main()

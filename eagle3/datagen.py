"""Self-distillation data from prompts that are not templates (eagle3/sources.py), resumable over many sessions.

    python -m eagle3.datagen --out data/round7 --sources stdlib,docs,man,licenses,chat --n 20000
    python -m eagle3.train --data data/round7 --out DIR [--init-from models/eagle3-smollm2-135m-instruct]

The first call writes the plan into --out: plan.json (the settings), prompts.jsonl (every text prompt, in order) and
manifest.json (prompts per source and task, and what was dropped); `--dry-run` stops there. Then the target answers
the prompts shard by shard (shard_00000.pt, ...): greedy, and a `--sample-share` of rows sampled at a temperature
drawn per row from `--temperature LO HI`. After each shard, the `chat` source turns some of its answers into
multi-turn chats (the exchange + a follow-up request; shard_00000_chat.pt, prompts in shard_00000_chat.jsonl), so
chats are there from the first shard on. Every shard is written atomically and its rows' sampling is seeded by the
shard, so the process can be killed at any time: a re-run with the same settings skips finished shards and produces
the same data. meta.json is written first, so eagle3.train can train on whatever shards exist.

Shards hold token ids only (prompt and answer, its prompt length and temperature: a few KB per answer, so a data set
of 20,000 answers can be committed and grown across sessions); eagle3.train computes the target's features from
them with one prefill per answer (eagle3/data.py `featurize`), cached beside the shards in features/."""
import argparse
import itertools
import json
import random
from pathlib import Path

import torch
from tqdm import tqdm

from .data import answer_shard
from .sources import ALL_SOURCES, Filter, build_prompts, chat_prompts, EvaluationText
from .target import DEFAULT_TARGET, load_target, load_tokenizer

PROMPT_ROOM = 8    # tokens kept free beyond the answer (chat template of the reply, off-by-ones)
FOLLOW_UP_ROOM = 128  # a chat may pass the prompt cap by the answer it holds and a follow-up turn


def prompt_budget(target, max_prompt_tokens, max_new_tokens, chat=False):
    """Longest prompt in tokens: the cap (raised for a chat, which holds a first prompt and its answer), and never
    past the context with room for the answer."""
    cap = max_prompt_tokens + (max_new_tokens + FOLLOW_UP_ROOM if chat else 0)
    return min(cap, target.max_context - max_new_tokens - PROMPT_ROOM)


def make_plan(target, settings):
    """The text prompts and the manifest. Chats come later, from answers; the manifest counts their plan."""
    sources, n = settings["sources"], settings["n"]
    texts = [s for s in sources if s != "chat"]
    n_chat = n // len(sources) if "chat" in sources else 0
    budget = prompt_budget(target, settings["max_prompt_tokens"], settings["max_new_tokens"])
    lengths = {}

    def fits(prompt):
        lengths[prompt] = len(target.encode_prompt(prompt))
        return lengths[prompt] <= budget
    rows, manifest = build_prompts(texts, n - n_chat, settings["seed"], fits=fits)
    for r in rows:
        r["prompt_tokens"] = lengths[r["prompt"]]
    # what the shards will hold: features of every prompt and answer token (3 layers, float16), so the disk need
    # is known before the run starts
    manifest["prompt_tokens"] = sum(r["prompt_tokens"] for r in rows)
    if n_chat:
        manifest["sources"]["chat"] = n_chat
        manifest["prompts"] += n_chat
    return rows, manifest


def load_or_make_plan(target, out, settings):
    """The plan in `out`, made on the first call; a re-run must use the same settings (else its shards would be
    answers to other prompts)."""
    plan = out / "plan.json"
    if plan.exists():
        old = json.loads(plan.read_text())
        if old != settings:
            raise SystemExit(f"{out} was started with other settings: {old}; use them or another --out")
        rows = [json.loads(line) for line in (out / "prompts.jsonl").read_text().splitlines()]
        return rows, json.loads((out / "manifest.json").read_text())
    rows, manifest = make_plan(target, settings)
    out.mkdir(parents=True, exist_ok=True)
    (out / "prompts.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    plan.write_text(json.dumps(settings))  # last: a plan without its prompts file is never trusted
    # meta.json marks a data directory for eagle3.train, which would otherwise answer its own prompts into it
    (out / "meta.json").write_text(json.dumps(dict(settings, target=target.name, generator="eagle3.datagen",
                                                   feature_layers=target.config.feature_layers)))
    return rows, manifest


def spread(total, sizes):
    """`total` split over parts in proportion to their sizes (integers; no part gets more than its size while
    total <= sum(sizes))."""
    ends = list(itertools.accumulate(sizes))
    return [total * e // ends[-1] - total * (e - n) // ends[-1] for e, n in zip(ends, sizes)]


def answer_text(target, seq):
    return target.decode([t for t in seq["tokens"][seq["prompt_len"]:].tolist() if t not in target.eos_ids]).strip()


def follow_up_chats(target, prompts, seqs, n, seed, keep):
    """n chats that continue this shard's exchanges, preferring greedy answers that ended (not cut off)."""
    done = [(p, answer_text(target, s)) for p, s in zip(prompts, seqs)
            if s["temperature"] == 0 and int(s["tokens"][-1]) in target.eos_ids]
    if len(done) < n:
        done = [(p, answer_text(target, s)) for p, s in zip(prompts, seqs)]
    chats = [c for c in chat_prompts([t for t in done if t[1]], len(done), seed) if keep(c)]
    return chats[:n]


class Run:
    """One generation run: settings, the target and the progress bar."""

    def __init__(self, target, out, settings, total):
        self.target, self.out, self.s = target, out, settings
        self.bar = tqdm(total=total, desc="datagen", unit="prompt")

    def shard(self, name, prompts, k):
        """Answer `prompts` into out/name.pt unless it exists; returns the records, or None when skipped."""
        path = self.out / f"{name}.pt"
        if path.exists():
            self.bar.update(len(prompts))
            return None
        rng = random.Random(f"{self.s['seed']}-{name}")  # per shard: a resumed run samples the same rows
        rows = [rng.random() < self.s["sample_share"] for _ in prompts]
        temps = [round(rng.uniform(*self.s["temperature"]), 2) for _ in prompts]
        gen = torch.Generator(device=self.target.device).manual_seed(self.s["seed"] * 1_000_003 + k)
        return answer_shard(self.target, prompts, path, self.s["max_new_tokens"], self.s["batch_size"], rows, temps,
                            gen, self.bar, features=False)


def generate(target, out, settings):
    """Answer the plan's prompts shard by shard, each followed by its chat shard. Resumable (see the module doc)."""
    out = Path(out)
    rows, manifest = load_or_make_plan(target, out, settings)
    size = settings["shard_size"]
    chunks = [rows[i: i + size] for i in range(0, len(rows), size)]
    n_chat = spread(manifest["sources"].get("chat", 0), [len(c) for c in chunks])
    run = Run(target, out, settings, manifest["prompts"])
    budget = prompt_budget(target, settings["max_prompt_tokens"], settings["max_new_tokens"], chat=True)
    evaluation = EvaluationText()
    for k, chunk in enumerate(chunks):
        prompts = [r["prompt"] for r in chunk]
        seqs = run.shard(f"shard_{k:05d}", prompts, k)
        if n_chat[k] and not (out / f"shard_{k:05d}_chat.pt").exists():
            seqs = seqs or torch.load(out / f"shard_{k:05d}.pt", weights_only=True)
            # a fresh filter per shard: a resumed run must pick the same chats as an uninterrupted one
            keep = Filter(lambda p: len(target.encode_prompt(p)) <= budget, evaluation)
            chats = follow_up_chats(target, prompts, seqs, n_chat[k], f"{settings['seed']}-{k}", keep)
            if len(chats) < n_chat[k]:  # too few answers usable (empty, or the chat too long): say so
                tqdm.write(f"shard {k}: {len(chats)} chats of {n_chat[k]} planned")
            (out / f"shard_{k:05d}_chat.jsonl").write_text("".join(json.dumps(c, ensure_ascii=False) + "\n"
                                                                   for c in chats))
            run.shard(f"shard_{k:05d}_chat", chats, k + len(chunks))
        elif n_chat[k]:
            run.bar.update(n_chat[k])
    run.bar.close()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="data directory (resumed if it exists)")
    ap.add_argument("--sources", default=",".join(ALL_SOURCES), help=f"comma-separated, of {','.join(ALL_SOURCES)}")
    ap.add_argument("--n", type=int, default=20000, help="prompts in all, split evenly over the sources")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--target", default=DEFAULT_TARGET)
    ap.add_argument("--max-new-tokens", type=int, default=160)
    ap.add_argument("--max-prompt-tokens", type=int, default=768, help="longest text prompt (chats: + an answer)")
    ap.add_argument("--shard-size", type=int, default=128)
    ap.add_argument("--batch", type=int, default=24, help="prompts answered at once")
    ap.add_argument("--sample-share", type=float, default=0.25, help="share of answers sampled instead of greedy")
    ap.add_argument("--temperature", type=float, nargs=2, default=[0.7, 1.0], metavar=("LO", "HI"))
    ap.add_argument("--dry-run", action="store_true", help="only write the plan and print the manifest")
    a = ap.parse_args(argv)
    sources = a.sources.split(",")
    if set(sources) - set(ALL_SOURCES) or sources == ["chat"] or a.n < len(sources):
        ap.error(f"--sources: some of {','.join(ALL_SOURCES)}, not chat alone; --n at least one per source")
    settings = dict(sources=sources, n=a.n, seed=a.seed, target=a.target, max_new_tokens=a.max_new_tokens,
                    max_prompt_tokens=a.max_prompt_tokens, shard_size=a.shard_size, batch_size=a.batch,
                    sample_share=a.sample_share, temperature=list(a.temperature))
    if a.dry_run:
        _, manifest = load_or_make_plan(load_tokenizer(a.target), Path(a.out), settings)
        print(json.dumps(manifest, indent=1))
        return
    generate(load_target(a.target), a.out, settings)


if __name__ == "__main__":
    main()

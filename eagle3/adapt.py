"""Workload adaptation: fine-tune the current draft head on the deployment's own greedy results, and install it
only if it decodes held-out items with a higher τ.

    python -m eagle3.adapt --last 500            # the last 500 completed greedy generation items
    python -m eagle3.adapt --job ID --job ID2    # those jobs' completed greedy items
    python -m eagle3.adapt --list                # head versions, with the τ their gate measured
    python -m eagle3.adapt --rollback            # `current` back to the current version's parent

A completed greedy item is self-distillation data for the price of one prefill: prompt + output is a sequence the
target chose itself, so one forward over it gives the target's features at every position and its argmax there
(the labels: the head learns only the target's own choices). The argmax is checked against the stored output. A
few disagreements are near-ties that a worker computing in another mode broke the other way (int4 kernel vs row
chunks: bf16 roundings differ), and the whole sequence is kept, as sampled training answers are; where more than
MAX_DISAGREE of the output disagrees, the output is not this target's and the sequence is cut at the first one.

The gate: τ (tokens emitted per draft/verify round) of an actual speculative decode, fixed tree, batch 1, greedy,
over a held-out slice of the items (chosen by item id, deterministically), for the current head and the
candidate. The candidate becomes the next version (eagle3/heads.py) only when its τ is higher.

This module never touches the job database: the CLI reads items through jobs/adaptation.py, and the Celery task
(worker/tasks.py adapt_head) hands them in."""
import argparse
import copy
import hashlib
import json
import math
import os
import random
import sys
import time
from dataclasses import asdict, dataclass

import torch

from . import hardware, heads
from .decoder import SpeculativeDecoder, default_head_path, head_of_version
from .layers import row_chunks
from .target import DEFAULT_TARGET, load_target
from .train import _batches, _collate, ttt_loss
from .verify import greedy


@dataclass
class Example:
    """A completed greedy item: its prompt as the worker encoded it and the tokens it produced."""
    item_id: int
    prompt_ids: list
    output_ids: list


@dataclass
class Report:
    parent: int  # the version that was current (and fine-tuned)
    tau_current: float
    tau_candidate: float
    installed: bool
    version: int | None  # the new version, when installed
    train_items: int
    heldout_items: int
    train_tokens: int  # response tokens with a label
    cut_items: int  # sequences cut: the stored output disagreed with the target's argmax too often (not its own)
    steps: int
    same_output: bool  # both heads decoded the held-out items to the same tokens (lossless)
    wall_s: float


# ------------------------------------------------------------------------------------------------ data


def split(examples, heldout_share=0.2):
    """(train, held-out). An item is held out when its hashed id falls in the first `heldout_share` of the hash
    range, whatever other items come with it: every run (tonight's --last 500, tomorrow's) keeps each item on the
    same side, so no head is gated on items an earlier version trained on. Too few items for that to leave both
    sides non-empty: the lowest hashes are held out instead."""
    if len(examples) < 2:
        raise ValueError(f"adaptation needs at least 2 completed greedy items, got {len(examples)}")
    held = [ex for ex in examples if _hash_fraction(ex.item_id) < heldout_share]
    if not held or len(held) == len(examples):
        order = sorted(examples, key=lambda ex: _hash_fraction(ex.item_id))
        held = order[:min(len(order) - 1, max(1, round(heldout_share * len(order))))]
    ids = {ex.item_id for ex in held}
    return [ex for ex in examples if ex.item_id not in ids], held


def _hash_fraction(item_id):
    """The item id's place in [0, 1), uniform and fixed."""
    return int(hashlib.sha256(str(item_id).encode()).hexdigest()[:8], 16) / 2 ** 32


MAX_DISAGREE = 0.1  # share of an output's tokens past which it is not the target's own (see the module's doc)


@torch.no_grad()
def sequence_of(target, example):
    """One prefill over prompt + output. Returns (sequence, kept): the sequence in eagle3/data.py's format
    (tokens, feats [L-1, 3h] float16, labels [L-1] = the target's argmax, -1 inside the prompt) with its first `kept`
    output tokens: all of them when the target's argmax disagrees with at most MAX_DISAGREE of the stored output,
    else those before the first disagreement."""
    model, dev = target.model, target.device
    prompt, output = list(example.prompt_ids), list(example.output_ids)
    tokens = torch.tensor(prompt + output, device=dev)[None]
    L = tokens.shape[1]
    cache = model.new_cache(1, L + 1)
    causal = torch.ones(1, L, L, dtype=torch.bool, device=dev).tril()
    logits, feats = model(tokens, torch.arange(L, device=dev)[None], cache, causal)
    argmax = greedy(logits[0]).cpu()
    P = len(prompt)
    predicted = argmax[P - 1: P - 1 + len(output)]  # what the target says follows each fed token
    wrong = (predicted != torch.tensor(output)).nonzero()
    kept = int(wrong[0]) if len(wrong) > MAX_DISAGREE * len(output) else len(output)
    n = P + kept
    labels = torch.cat([torch.full((P - 1,), -1), predicted[:kept]]).to(torch.int32)
    seq = dict(tokens=tokens[0, :n].cpu().to(torch.int32), feats=feats[0, : n - 1].half().cpu(), labels=labels,
               prompt_len=P)
    return seq, kept


def build_sequences(target, examples):
    """Training sequences (those with at least one kept token) and how many items were cut."""
    seqs, cut = [], 0
    # Row chunks where the device has them (hardware.row_chunk): ~4x faster than the int4 kernel over a prompt's
    # rows, and the numerics of batch >= 16 decodes; items from smaller batches differ on near-ties (MAX_DISAGREE).
    with row_chunks(hardware.row_chunk(target.model)):
        for ex in examples:
            seq, kept = sequence_of(target, ex)
            cut += kept < len(ex.output_ids)
            if kept:
                seqs.append(seq)
    return seqs, cut


# ------------------------------------------------------------------------------------------- the head


def load_head(target, version):
    """A version of the head, trainable (float32); adapting a target shipped without a head starts from the
    untrained head its workers use."""
    return head_of_version(target, version)


def as_stored(head):
    """The head as a worker will load it (saved in float16), so the gate measures exactly what gets installed."""
    return head.to(torch.float16).to(torch.float32)


def finetune(target, head, seqs, steps, lr, ttt_steps=5, max_tokens=2048, clip=0.5, seed=0, log=print):
    """`steps` AdamW steps of eagle3/train.py's training-time-test loss, the draft vocabulary kept (a few hundred
    items are too few to choose a new one); a short warm-up, then cosine down to 10% of `lr`."""
    rng = random.Random(seed)
    opt = torch.optim.AdamW(head.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    warmup = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup) * (
        0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * s / steps))))
    head.train()
    queue, embed = [], target.model.embed_tokens
    for step in range(steps):
        if not queue:
            queue = _batches(seqs, max_tokens, rng)
        tokens, feats, labels = _collate(seqs, queue.pop(), target.device)
        loss, accs = ttt_loss(head, embed, tokens, feats, labels, ttt_steps)
        if not torch.is_tensor(loss):  # no label of this batch is in the draft vocabulary
            continue
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), clip)
        opt.step()
        sched.step()
        if (step + 1) % 10 == 0 or step + 1 == steps:
            log(f"step {step + 1}/{steps} loss {loss.item():.3f} acc " + "/".join(f"{a:.2f}" for a in accs))
    return head.eval()


def steps_for(seqs, epochs, max_tokens=2048):
    return max(1, round(epochs * len(_batches(seqs, max_tokens, random.Random(0)))))


# -------------------------------------------------------------------------------------------- the gate


def measure_tau(target, head, examples, max_new_tokens=64):
    """τ of an actual speculative decode with the fixed tree (adaptive off), batch 1, greedy, over the examples'
    prompts, each up to its stored output's length. Returns (τ, the decoded token ids)."""
    decoder = SpeculativeDecoder(target, draft=copy.deepcopy(head), adaptive=False)
    rounds = accepted = 0
    outputs = []
    for ex in examples:
        limit = max(1, min(max_new_tokens, len(ex.output_ids)))
        result = decoder.generate_ids([list(ex.prompt_ids)], max_new_tokens=limit, batch_size=1)[0]
        rounds += result.stats["rounds"]
        accepted += result.stats["accept_length"] * result.stats["rounds"]
        outputs.append(result.token_ids)
    return (accepted / rounds if rounds else 1.0), outputs


def install(target, head, meta):
    """Save `head` as the next version and point `current` at it. Returns the version."""
    root = default_head_path(target)
    version, path = heads.new_version_dir(root)
    (path / "meta.json").write_text(json.dumps({**meta, "version": version}, indent=1))
    head.save_pretrained(path)
    heads.set_current(root, version)
    return version


def adapt(target, examples, steps=None, epochs=1.0, lr=1e-4, heldout_share=0.2, eval_tokens=64, seed=0, log=print):
    """Fine-tune the current head on `examples` (train slice), gate it on the held-out slice, install it if τ rose."""
    started = time.time()
    parent = heads.current_version(default_head_path(target))
    train_ex, heldout = split(examples, heldout_share)
    seqs, cut = build_sequences(target, train_ex)
    if not seqs:
        raise ValueError("no training item agrees with the target's own greedy output")
    steps = steps or steps_for(seqs, epochs)
    log(f"{len(seqs)} training sequences ({cut} cut: not the target's own output), {len(heldout)} held out, "
        f"{steps} steps from version {parent}")
    current = load_head(target, parent)
    candidate = as_stored(finetune(target, copy.deepcopy(current), seqs, steps, lr, seed=seed, log=log))
    tau_current, out_current = measure_tau(target, current, heldout, eval_tokens)
    tau_candidate, out_candidate = measure_tau(target, candidate, heldout, eval_tokens)
    installed = tau_candidate > tau_current
    log(f"held-out τ: current (version {parent}) {tau_current:.3f}, candidate {tau_candidate:.3f} -> "
        + ("installed" if installed else "refused (not better)"))
    report = Report(parent=parent, tau_current=tau_current, tau_candidate=tau_candidate, installed=installed,
                    version=None, train_items=len(seqs), heldout_items=len(heldout),
                    train_tokens=sum(int((s["labels"] >= 0).sum()) for s in seqs), cut_items=cut, steps=steps,
                    same_output=out_current == out_candidate, wall_s=0.0)
    if installed:
        report.version = install(target, candidate, dict(
            parent=parent, tau=tau_candidate, parent_tau=tau_current, created=time.strftime("%Y-%m-%dT%H:%M:%SZ",
            time.gmtime()), train_items=len(seqs), heldout_items=len(heldout), steps=steps, lr=lr,
            heldout_item_ids=[ex.item_id for ex in heldout]))
    report.wall_s = time.time() - started
    return report


# ------------------------------------------------------------------------------------------------ CLI


def version_lines(root):
    """One line per version: id, current marker, the τ its gate measured (and its parent's on the same items)."""
    current = heads.current_version(root)
    lines = ["version  current  parent  tau     parent_tau  heldout  created"]
    for v in heads.list_versions(root):
        m = heads.read_meta(root, v)
        tau = f"{m['tau']:.3f}" if "tau" in m else "-"
        parent_tau = f"{m['parent_tau']:.3f}" if "parent_tau" in m else "-"
        lines.append(f"{v:<8} {'*' if v == current else '':<8} {m.get('parent', '-')!s:<7} {tau:<7} "
                     f"{parent_tau:<11} {m.get('heldout_items', '-')!s:<8} {m.get('created', 'shipped')}")
    return lines


def load_examples(target_name, job_ids, last):
    """The CLI's item source: the job database through jobs/ (imported here only, so the engine part of this module
    stays free of the service)."""
    from jobs.adaptation import greedy_items
    from jobs.config import get_settings
    from jobs.db import session_factory
    from jobs.tokenizer import load as load_chat

    with session_factory(get_settings().database_url)() as session:
        return [Example(*row) for row in greedy_items(session, load_chat(target_name), job_ids, last)]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", help=f"target name (default: EAGLE3_TARGET, else {DEFAULT_TARGET})")
    ap.add_argument("--job", action="append", default=[], help="a job id whose completed greedy items to use")
    ap.add_argument("--last", type=int, help="the last N completed greedy generation items (of --job's jobs, if given)")
    ap.add_argument("--steps", type=int, help="optimizer steps (default: --epochs over the training items)")
    ap.add_argument("--epochs", type=float, default=1.0)
    ap.add_argument("--lr", type=float, default=1e-4, help="peak learning rate (small: this is a fine-tune)")
    ap.add_argument("--heldout", type=float, default=0.2, help="share of the items held out for the gate")
    ap.add_argument("--eval-tokens", type=int, default=64, help="new tokens per held-out item in the gate's decode")
    ap.add_argument("--list", action="store_true", help="list head versions and exit")
    ap.add_argument("--rollback", action="store_true", help="point `current` at the current version's parent")
    a = ap.parse_args(argv)
    name = a.target or os.environ.get("EAGLE3_TARGET") or DEFAULT_TARGET
    if not (a.list or a.rollback or a.job or a.last):
        ap.error("give --job ID (repeatable) and/or --last N, or --list / --rollback")
    try:
        run(a, name)
    except ValueError as exc:  # nothing to roll back to, too few items: a message, not a traceback
        sys.exit(f"eagle3.adapt: {exc}")


def run(a, name):
    root = heads.head_root(name)
    if a.list:
        print("\n".join(version_lines(root)))
    elif a.rollback:
        old, new = heads.rollback(root)
        print(f"current: version {old} -> {new}")
    else:
        report = adapt(load_target(name), load_examples(name, a.job, a.last), steps=a.steps, epochs=a.epochs,
                       lr=a.lr, heldout_share=a.heldout, eval_tokens=a.eval_tokens)
        print(json.dumps(asdict(report)))


if __name__ == "__main__":
    main()

"""Train an EAGLE-3 draft head for a target by self-distillation, with the "training-time test" unroll.

    python -m eagle3.train --target smollm2-135m-instruct --out models/eagle3-smollm2-135m-instruct

Step 0 of the unroll reads fc(target features) at every position; step i reads the head's own step i-1 output,
sees the context's step-0 keys plus its own chain's keys (exactly what a depth-(i+1) tree node sees at inference),
and predicts one token further ahead. Loss: sum_i 0.8^i * loss(step i) over the draft vocabulary, on response tokens
whose target argmax is in the draft vocabulary. Resumable from the checkpoint in --out.

Recipe options: --unroll N (steps of the unroll), --loss ce|tv|lk (step_loss), --eagle31 (the EAGLE 3.1 norms,
draft.py), --val-frac (held-out answers: after each epoch the head's simulated tau on them is logged to
train_log.json, and --out keeps the best epoch's head)."""
import argparse
import json
import math
import random
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from .data import generate_dataset, load_dataset
from .draft import Eagle3Head, HeadConfig
from .layers import KVCache, attention_mask, cache_dtype, quantises
from .prompts import TRAINING_PROMPTS, training_prompts
from .target import load_target


def draft_vocab_from_data(seqs, size, vocab_size):
    """The `size` most frequent target argmax tokens of the responses (ids sorted)."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for s in seqs:
        lab = s["labels"].long()
        counts += torch.bincount(lab[lab >= 0], minlength=vocab_size)
    size = min(size, vocab_size)
    return counts.topk(size).indices.sort().values, counts


def init_head(target, draft_ids, seed=0, eagle31=False):
    """A head that starts out as "the target's high-layer features, read by the target's own output layer": fc
    passes the high features through, the layer's residual branches start at zero (o_proj, down_proj), and norm +
    lm_head are the target's (draft-vocabulary rows). Training then only has to learn the step ahead. eagle31: the
    EAGLE 3.1 norms (fc_norm + norm_output, draft.py); the readout start holds, as norm(fc_norm(x)) = norm(x)."""
    c = replace(HeadConfig.for_target(target.config, draft_vocab_size=len(draft_ids)), fc_norm=eagle31,
                norm_output=eagle31)
    head = Eagle3Head.random(c, seed=seed)
    head.set_vocab(draft_ids)
    h = c.hidden_size
    with torch.no_grad():
        head.lm_head.weight.copy_(target.model.lm_head.weight[draft_ids].float())
        head.norm.weight.copy_(target.model.norm.weight.float())
        if c.target_hidden_size == h:
            head.fc.weight.zero_()
            head.fc.weight[:, 2 * h:] = torch.eye(h)
        head.midlayer.self_attn.o_proj.weight.zero_()
        head.midlayer.mlp.down_proj.weight.zero_()
    return head


def _load_shared(head, start):
    """Copy `start`'s weights into `head`; lm_head rows by target token, where both vocabularies have it."""
    sd = {k: v for k, v in start.state_dict().items() if k not in ("lm_head.weight", "d2t", "t2d")}
    head.load_state_dict(sd, strict=False)
    ids = head.to_target_ids(torch.arange(head.config.draft_vocab_size))
    old_ids = start.to_target_ids(torch.arange(start.config.draft_vocab_size))
    row_of = torch.full((start.config.vocab_size,), -1, dtype=torch.long)
    row_of[old_ids] = torch.arange(len(old_ids))
    shared = row_of[ids] >= 0
    with torch.no_grad():
        head.lm_head.weight[shared] = start.lm_head.weight[row_of[ids][shared]].to(head.lm_head.weight.dtype)


def _repeat_kv(x, n):
    return x.repeat_interleave(n, dim=1) if n > 1 else x


def _shift(x, shift, T, fill):
    """x[:, shift: shift + T], padded with `fill` to T columns: what step shift-1 of the unroll reads or predicts."""
    x = x[:, shift: shift + T]
    return F.pad(x, (0, 0) * (x.dim() - 2) + (0, T - x.shape[1]), value=fill)


def _unroll(head, embed, tokens, feats, steps):
    """The training-time-test unroll. tokens [B, L], feats [B, L-1, 3h]; yields (i, out) for i < steps, out [B, L-1, h]
    the step's output at every anchor t: step i reads token t+i+1 and predicts the label at t+i+1, seeing the
    context's step-0 keys up to t plus its own chain's keys (what a depth-(i+1) tree node sees at inference)."""
    ml, att = head.midlayer, head.midlayer.self_attn
    B, T = feats.shape[:2]
    H, Hkv, D = att.hq, att.hkv, att.d
    dev, dtype = feats.device, head.fc.weight.dtype
    hidden = head.project(feats.to(dtype))
    causal = torch.ones(T, T, dtype=torch.bool, device=dev).tril()
    scale = 1.0 / math.sqrt(D)
    k0 = v0 = None
    ks, vs = [], []
    for i in range(steps):
        with torch.no_grad():
            emb = embed(_shift(tokens, i + 1, T, 0).long()).to(dtype)
        x = torch.cat([ml.input_layernorm(emb), ml.hidden_norm(hidden)], -1)
        q = att.q_proj(x).view(B, T, H, D).transpose(1, 2)
        k = att.k_proj(x).view(B, T, Hkv, D).transpose(1, 2)
        v = att.v_proj(x).view(B, T, Hkv, D).transpose(1, 2)
        q, k = head.rope(q, k, (torch.arange(T, device=dev) + i).expand(B, T))
        k, v = _repeat_kv(k, H // Hkv), _repeat_kv(v, H // Hkv)
        if i == 0:
            k0, v0 = k, v
        else:
            ks.append(k)
            vs.append(v)
        s = (q @ k0.transpose(-1, -2)) * scale
        s = s.masked_fill(~causal, float("-inf"))
        diag = [(q * kj).sum(-1, keepdim=True) * scale for kj in ks]  # own chain: steps 1..i at the same anchor
        p = torch.softmax(torch.cat([s] + diag, -1), -1)
        o = p[..., :T] @ v0
        for j, vj in enumerate(vs):
            o = o + p[..., T + j: T + j + 1] * vj
        h = hidden + att.o_proj(o.transpose(1, 2).reshape(B, T, H * D))
        hidden = head.output(h + ml.mlp(ml.post_attention_layernorm(h)))
        yield i, hidden


def _draft_index(head, target_ids):
    """Target token ids -> draft ids (-1: not in the draft vocabulary, or no label)."""
    c = head.config
    index = torch.full((c.vocab_size,), -1, dtype=torch.long, device=target_ids.device)
    index[head.to_target_ids(torch.arange(c.draft_vocab_size, device=target_ids.device))] = torch.arange(
        c.draft_vocab_size, device=target_ids.device)
    return torch.where(target_ids >= 0, index[target_ids.clamp(min=0).long()], -1)


LOSSES = ("ce", "tv", "lk")


def step_loss(kind, logits, labels, target_logits=None, eta=3.0):
    """One unroll step's loss over the draft vocabulary. ce: cross-entropy to the target's argmax (labels). tv: total
    variation 1 - sum_v min(p_v, q_v) between the target's distribution p (target_logits, renormalised over the
    draft vocabulary) and the draft's q; sum min(p, q) is the probability that sampled speculation accepts the
    draft's token, so tv optimises acceptance itself. lk: the adaptive "LK" blend w*KL(p||q) + (1-w)*tv with
    w = exp(-eta * overlap), overlap not differentiated: KL's (= soft cross-entropy's) strong gradient while the
    overlap is small, tv once it has grown (Samarin et al., "LK Losses", arXiv 2602.23881; eta 3 is their choice)."""
    if kind == "ce":
        return F.cross_entropy(logits, labels)
    log_q = torch.log_softmax(logits.float(), -1)
    log_p = torch.log_softmax(target_logits.float(), -1)
    overlap = torch.minimum(log_p.exp(), log_q.exp()).sum(-1)
    if kind == "tv":
        return (1 - overlap).mean()
    kl = F.kl_div(log_q, log_p, log_target=True, reduction="none").sum(-1)
    w = torch.exp(-eta * overlap.detach())
    return (w * kl + (1 - w) * (1 - overlap)).mean()


def ttt_loss(head, embed, tokens, feats, labels, steps, decay=0.8, loss="ce", target_logits=None):
    """tokens [B, L], feats [B, L-1, 3h], labels [B, L-1] (-1: no loss); target_logits [B, L-1, draft_vocab] for the
    tv / lk losses (target_draft_logits). Returns (sum_i decay^i * loss_i, per-step accuracy list)."""
    T = labels.shape[1]
    draft_labels = _draft_index(head, labels)
    total, accs = 0.0, []
    for i, out in _unroll(head, embed, tokens, feats, steps):
        dl = _shift(draft_labels, i + 1, T, -1)
        sel = dl >= 0  # response tokens the draft vocabulary can express
        if not sel.any():
            accs.append(float("nan"))
            continue
        logits = head.logits(out[sel])
        tl = None if target_logits is None else _shift(target_logits, i + 1, T, 0.0)[sel]
        total = total + decay ** i * step_loss(loss, logits, dl[sel], tl)
        accs.append((logits.argmax(-1) == dl[sel]).float().mean().item())
    return total, accs


@torch.no_grad()
def target_draft_logits(target, feats, draft_ids):
    """The target's logits over the draft vocabulary at every position, [B, L-1, len(draft_ids)], from the stored
    features. The data keeps only the target's argmax, and its high feature is the *input* of layer n-3, not the
    final hidden state (norm + lm_head on it would not give the target's logits), so the target's last layers run
    over the sequence from it (causal, fresh cache), then norm and the draft rows of lm_head (in float32). Exact in
    float64 (tested); otherwise off by the rounding of the stored float16 features and of a reduced-precision
    target's own logits. Costs those layers once per batch, not per unroll step."""
    model, c = target.model, target.config
    first = c.feature_layers[2]
    x = feats[..., 2 * c.hidden_size:].to(model.norm.weight.dtype)
    B, T, _ = x.shape
    dev = x.device
    cache = KVCache(c.num_hidden_layers - first, B, c.num_key_value_heads, T, c.head_dim,
                    cache_dtype(model.embed_tokens.weight, model.config.head_dim, quantises(model)), dev)
    causal = torch.ones(T, T, dtype=torch.bool, device=dev).tril().expand(B, T, T)
    rope = model.rope.table(torch.arange(T, device=dev).expand(B, T), cache.dtype)
    mask, slots = attention_mask(cache.lens, causal, T), cache.slots(0, T)
    for i in range(first, c.num_hidden_layers):
        x = model.layers[i](x, rope, cache, i - first, slots, mask)
    return F.linear(model.norm(x).float(), model.lm_head.weight[draft_ids.to(dev)].float())


# ---------------------------------------------------------------- held-out simulated tau


def simulated_tau(hits):
    """hits [N, steps] bool: at each of N anchors, whether the head's step-i top-1 equals the target's token. A chain
    draft of `steps` tokens accepts up to the first miss, so tau = 1 + sum_d prod_{i<=d} acc_i with acc_i the step-i
    agreement among anchors whose steps 0..i-1 all agreed (prod_{i<=d} acc_i = share of anchors alive after d).
    Returns (tau, [acc_i])."""
    alive = hits.long().cumprod(1).double()  # [N, steps]: chain intact through step i
    reach = alive.sum(0)
    before = torch.cat([torch.tensor([float(len(hits))], dtype=torch.float64), reach[:-1]])
    accs = [float(r / b) if b > 0 else 0.0 for r, b in zip(reach, before)]
    return 1.0 + float(alive.mean(0).sum()) if len(hits) else float("nan"), accs


@torch.no_grad()
def chain_hits(head, embed, tokens, feats, labels, steps):
    """[anchors, steps] top-1 agreement of each unroll step with the target's argmax, for the anchors whose chain
    runs inside the response and whose chain inputs are the target's own greedy tokens (on sampled answers some are
    not): there the unroll is exactly a greedy chain draft at inference. Tokens outside the draft vocabulary miss."""
    T = labels.shape[1]
    ok = torch.ones_like(labels, dtype=torch.bool)
    hits = []
    for i, out in _unroll(head, embed, tokens, feats, steps):
        lab = _shift(labels, i + 1, T, -1)
        ok &= lab >= 0
        if i > 0:  # step i reads token t+i+1 where inference reads the accepted draft of step i-1 (label at t+i)
            ok &= _shift(tokens, i + 1, T, -1) == _shift(labels, i, T, -2)
        hits.append(head.to_target_ids(head.logits(out).argmax(-1)) == lab)
    return torch.stack(hits, -1)[ok]


def heldout_tau(head, embed, seqs, steps, max_tokens, dev):
    """Simulated tau (simulated_tau) of the head on held-out sequences; (tau, [acc_i])."""
    hits = [chain_hits(head, embed, *_collate(seqs, idx, dev), steps)
            for idx in _batches(seqs, max_tokens, random.Random(0))]
    return simulated_tau(torch.cat(hits).cpu() if hits else torch.zeros(0, steps, dtype=torch.bool))


def split_heldout(seqs, frac, seed=0):
    """(train, held-out): a seeded random `frac` of the sequences (at least one when frac > 0), never trained on."""
    n = min(len(seqs) - 1, math.ceil(frac * len(seqs))) if frac > 0 else 0
    held = set(random.Random(seed).sample(range(len(seqs)), n))
    return [s for i, s in enumerate(seqs) if i not in held], [s for i, s in enumerate(seqs) if i in held]


def crop_prompts(seqs, context):
    """Keep at most `context` prompt tokens before each answer (None: all). Loss is taken on answer tokens only, and
    the stored features already carry the whole prompt (the target computed them over all of it), so the dropped
    positions cost compute without adding a label: round 7's prompts are 3.6x its answers. The head then attends
    to at most `context` prompt positions in training, more at inference; RoPE makes positions relative, so the
    shift itself changes nothing."""
    if context is None:
        return seqs
    out = []
    for s in seqs:
        k = max(0, s["prompt_len"] - context)
        out.append(s if k == 0 else dict(s, tokens=s["tokens"][k:], feats=s["feats"][k:], labels=s["labels"][k:],
                                         prompt_len=s["prompt_len"] - k))
    return out


def _batches(seqs, max_tokens, rng):
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]["tokens"]))
    out, cur, longest = [], [], 0
    for i in order:
        L = len(seqs[i]["tokens"])
        if cur and max(longest, L) * (len(cur) + 1) > max_tokens:
            out.append(cur)
            cur, longest = [], 0
        cur.append(i)
        longest = max(longest, L)
    if cur:
        out.append(cur)
    rng.shuffle(out)
    return out


def _collate(seqs, idx, dev):
    L = max(len(seqs[i]["tokens"]) for i in idx)
    B, F3 = len(idx), seqs[idx[0]]["feats"].shape[1]
    tokens = torch.zeros(B, L, dtype=torch.long)
    feats = torch.zeros(B, L - 1, F3)
    labels = torch.full((B, L - 1), -1, dtype=torch.long)
    for r, i in enumerate(idx):
        s = seqs[i]
        n = len(s["tokens"])
        tokens[r, :n] = s["tokens"].long()
        feats[r, : n - 1] = s["feats"].float()
        labels[r, : n - 1] = s["labels"].long()
    return tokens.to(dev), feats.to(dev), labels.to(dev)


def train(target, seqs, out, draft_vocab=8192, epochs=2.0, max_tokens=2048, lr=5e-4, ttt_steps=5, warmup=0.05,
          clip=0.5, ckpt_every=50, seed=0, init_from=None, eagle31=None, loss="ce", val_frac=0.05, keep_vocab=False,
          log=print):
    """Train (or resume) a head on `seqs`; writes out/config.json + model.safetensors, out/train_state.pt and
    out/train_log.json. Returns (the saved head, per-step history).

    init_from: a saved head to start from instead of the target's readout. The draft vocabulary is still chosen from
    `seqs`; lm_head rows of tokens the saved head also has are copied, new tokens start from the target's rows.
    keep_vocab: with init_from, keep its draft vocabulary instead (a small data set picks a worse one: the round-7
    fine-tune on ~1,400 answers that re-picked it scored lower on free-form prompts than the head it started from).
    eagle31: the EAGLE 3.1 norms; None = on for a new head, the init_from head's setting when fine-tuning.
    loss: "ce", "tv" or "lk" (step_loss). val_frac: the share of `seqs` held out and never trained on; after every
    epoch (and at the end) the head's simulated tau on it is logged, and out/ keeps the head of the best epoch
    (val_frac 0: of the last)."""
    assert loss in LOSSES, loss
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    dev = target.device
    rng = random.Random(seed)
    state_path = out / "train_state.pt"
    state = torch.load(state_path, weights_only=False) if state_path.exists() else None
    seqs, heldout = split_heldout(seqs, val_frac, seed)
    head, draft_ids = _start_head(target, seqs, draft_vocab, seed, init_from, eagle31, state, log, keep_vocab)
    head = head.to(dev).train()
    vocab_ids = head.to_target_ids(torch.arange(head.config.draft_vocab_size, device=dev))
    opt = torch.optim.AdamW(head.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    per_epoch = len(_batches(seqs, max_tokens, random.Random(0)))
    total = max(1, int(epochs * per_epoch))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / max(1, warmup * total)) * (
        0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, s / total)))))
    step, history, evals, best = 0, [], [], None
    if state:
        head.load_state_dict(state["head"])
        opt.load_state_dict(state["opt"])
        sched.load_state_dict(state["sched"])
        step, history = state["step"], state["history"]
        evals, best = state.get("evals", []), state.get("best")
        rng.setstate(state["rng"])
        log(f"resumed at step {step}/{total}")
    embed = target.model.embed_tokens
    bar = tqdm(total=total, initial=step, desc="train eagle3", unit="step")
    queue = []
    t0 = time.time()
    while step < total:
        if not queue:
            queue = _batches(seqs, max_tokens, rng)
        tokens, feats, labels = _collate(seqs, queue.pop(), dev)
        tl = None if loss == "ce" else target_draft_logits(target, feats, vocab_ids)
        value, accs = ttt_loss(head, embed, tokens, feats, labels, ttt_steps, loss=loss, target_logits=tl)
        opt.zero_grad(set_to_none=True)
        value.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), clip)
        opt.step()
        sched.step()
        step += 1
        history.append(dict(step=step, loss=value.item(), acc=accs))
        bar.update(1)
        bar.set_postfix(loss=f"{history[-1]['loss']:.3f}", acc="/".join(f"{a:.2f}" for a in accs))
        if step % per_epoch == 0 or step == total:
            since = evals[-1]["step"] if evals else 0
            evals.append(_evaluate(head, embed, heldout, ttt_steps, max_tokens, dev, history[since:], per_epoch))
            if heldout:
                log(f"epoch {evals[-1]['epoch']}: held-out simulated tau {evals[-1]['tau']:.3f}")
            if _better(evals[-1], best):
                best = evals[-1]
                head.save_pretrained(out)
        if step % ckpt_every == 0 or step == total:
            tmp = state_path.with_suffix(".tmp")
            torch.save(dict(head=head.state_dict(), opt=opt.state_dict(), sched=sched.state_dict(), step=step,
                            history=history, rng=rng.getstate(), draft_ids=draft_ids, evals=evals, best=best,
                            eagle31=head.config.fc_norm), tmp)
            tmp.rename(state_path)
    bar.close()
    (out / "train_log.json").write_text(json.dumps(dict(
        steps=step, epochs=epochs, sequences=len(seqs), heldout_sequences=len(heldout),
        tokens=sum(len(s["tokens"]) for s in seqs), draft_vocab=len(draft_ids), ttt_steps=ttt_steps, lr=lr,
        loss=loss, eagle31=head.config.fc_norm, wall_s=time.time() - t0, per_epoch=evals, best=best,
        last=history[-20:])))
    return Eagle3Head.from_pretrained(out, device=dev), history


def _start_head(target, seqs, draft_vocab, seed, init_from, eagle31, state, log, keep_vocab=False):
    """(head, draft ids): a resumed run's architecture (weights come from its state), or a new head on the
    training answers' most frequent tokens (or init_from's own vocabulary: keep_vocab), from the target's readout or
    from init_from's weights."""
    if state:  # states from before EAGLE 3.1 have no flag: their heads had no norms
        return init_head(target, state["draft_ids"], seed, state.get("eagle31", False)), state["draft_ids"]
    start = Eagle3Head.from_pretrained(init_from) if init_from else None
    if start is not None and keep_vocab:
        draft_ids = start.to_target_ids(torch.arange(start.config.draft_vocab_size))
    else:
        draft_ids, _ = draft_vocab_from_data(seqs, draft_vocab, target.config.vocab_size)
    if eagle31 is None:  # a fine-tune keeps its head's architecture: its fc learnt the features it was given
        eagle31 = bool(start.config.fc_norm and start.config.norm_output) if start else True
    head = init_head(target, draft_ids, seed, eagle31)
    if start:
        _load_shared(head, start)
        log(f"starting from the head in {init_from}")
    return head, draft_ids


def _better(record, best):
    """Keep this epoch's head? Yes without held-out data or a count (no chain to score: tau nan), as the last epoch
    then; else only when its simulated tau beats the best so far."""
    if best is None or record["tau"] is None or math.isnan(record["tau"]) or math.isnan(best["tau"]):
        return True
    return record["tau"] > best["tau"]


def _evaluate(head, embed, heldout, steps, max_tokens, dev, epoch_history, per_epoch):
    """One epoch's record for train_log.json: held-out simulated tau and step accuracies, mean training loss."""
    tau, accs = heldout_tau(head, embed, heldout, steps, max_tokens, dev) if heldout else (None, [])
    step = epoch_history[-1]["step"]
    return dict(epoch=round(step / per_epoch, 3), step=step, tau=tau, acc=accs,
                loss=sum(h["loss"] for h in epoch_history) / len(epoch_history))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="smollm2-135m-instruct", help="default model name or a local HF directory")
    ap.add_argument("--out", required=True, help="output directory for the head (EAGLE-3 layout)")
    ap.add_argument("--data", help="self-distillation data directory (default: data/<target name>)")
    ap.add_argument("--prompts", type=int, default=TRAINING_PROMPTS, help="number of training prompts to answer")
    ap.add_argument("--skip-prompts", type=int, default=0,
                    help="skip the first K built-in prompts (fresh data for a fine-tune with --init-from)")
    ap.add_argument("--prompts-file", help="JSONL with a 'prompt' per line instead of the built-in prompt set")
    ap.add_argument("--max-new-tokens", type=int, default=160)
    ap.add_argument("--gen-batch", type=int, default=24)
    ap.add_argument("--draft-vocab", type=int, default=8192)
    ap.add_argument("--epochs", type=float, default=2.0)
    ap.add_argument("--max-tokens", type=int, default=2048, help="padded tokens per training batch")
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--unroll", "--ttt-steps", dest="ttt_steps", type=int, default=5,
                    help="training-time-test steps (draft depth trained for; 7 in the EAGLE-3 reference)")
    ap.add_argument("--loss", choices=LOSSES, default="ce", help="ce: cross-entropy to the target's argmax; tv: total "
                    "variation to the target's distribution (acceptance itself); lk: adaptive KL/tv blend")
    ap.add_argument("--eagle31", action=argparse.BooleanOptionalAction, default=None,
                    help="EAGLE 3.1 norms (fc_norm, norm_output in config.json); default: on for a new head, as the "
                    "--init-from head otherwise")
    ap.add_argument("--val-frac", type=float, default=0.05,
                    help="share of the answers held out to pick the epoch with the best simulated tau (0: last epoch)")
    ap.add_argument("--prompt-context", type=int, default=None,
                    help="train on at most this many prompt tokens before each answer (default: all)")
    ap.add_argument("--init-from", help="start from this saved head (fine-tune) instead of the target's readout; "
                    "lm_head rows of tokens both vocabularies share are kept")
    ap.add_argument("--keep-vocab", action="store_true",
                    help="with --init-from: keep that head's draft vocabulary instead of picking one from the data")
    a = ap.parse_args(argv)
    if a.keep_vocab and not a.init_from:
        ap.error("--keep-vocab needs --init-from")
    if a.skip_prompts < 0 or a.prompts < 1:
        ap.error("--skip-prompts must be >= 0 and --prompts >= 1")
    if a.ttt_steps < 1 or not 0 <= a.val_frac < 1:
        ap.error("--unroll must be >= 1 and --val-frac in [0, 1)")
    if a.prompt_context is not None and a.prompt_context < 1:
        ap.error("--prompt-context must be >= 1")
    target = load_target(a.target)
    data = Path(a.data or Path("data") / target.name)
    if not (data / "meta.json").exists():
        if a.prompts_file:
            prompts = [json.loads(line)["prompt"] for line in open(a.prompts_file) if line.strip()]
        else:
            prompts = [p["prompt"] for p in training_prompts(a.skip_prompts + a.prompts)[a.skip_prompts:]]
        generate_dataset(target, prompts, data, max_new_tokens=a.max_new_tokens, batch_size=a.gen_batch)
    seqs = crop_prompts(load_dataset(data, target), a.prompt_context)
    print(f"{len(seqs)} sequences, {sum(len(s['tokens']) for s in seqs)} tokens", flush=True)
    train(target, seqs, a.out, draft_vocab=a.draft_vocab, epochs=a.epochs, max_tokens=a.max_tokens, lr=a.lr,
          ttt_steps=a.ttt_steps, init_from=a.init_from, eagle31=a.eagle31, loss=a.loss, val_frac=a.val_frac,
          keep_vocab=a.keep_vocab)


if __name__ == "__main__":
    main()

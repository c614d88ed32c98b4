"""Train an EAGLE-3 draft head for a target by self-distillation, with the "training-time test" unroll.

    python -m eagle3.train --target smollm2-135m-instruct --out models/eagle3-smollm2-135m-instruct

Step 0 of the unroll reads fc(target features) at every position; step i reads the head's own step i-1 output,
sees the context's step-0 keys plus its own chain's keys (exactly what a depth-(i+1) tree node sees at inference),
and predicts one token further ahead. Loss: sum_i 0.8^i * CE(step i) over the draft vocabulary, on response tokens
whose target argmax is in the draft vocabulary. Resumable from the checkpoint in --out."""
import argparse
import json
import math
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from .data import generate_dataset, load_dataset
from .draft import Eagle3Head, HeadConfig
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


def init_head(target, draft_ids, seed=0):
    """A head that starts out as "the target's high-layer features, read by the target's own output layer": fc
    passes the high features through, the layer's residual branches start at zero (o_proj, down_proj), and norm +
    lm_head are the target's (draft-vocabulary rows). Training then only has to learn the step ahead."""
    c = HeadConfig.for_target(target.config, draft_vocab_size=len(draft_ids))
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


def ttt_loss(head, embed, tokens, feats, labels, steps, decay=0.8):
    """tokens [B, L], feats [B, L-1, 3h], labels [B, L-1] (-1: no loss). Returns (loss, per-step accuracy list)."""
    ml, att = head.midlayer, head.midlayer.self_attn
    B, T = labels.shape
    H, Hkv, D = att.hq, att.hkv, att.d
    dev = feats.device
    t2d_index = torch.full((head.config.vocab_size,), -1, dtype=torch.long, device=dev)
    t2d_index[head.to_target_ids(torch.arange(head.config.draft_vocab_size, device=dev))] = torch.arange(
        head.config.draft_vocab_size, device=dev)
    dtype = head.fc.weight.dtype
    hidden = head.fc(feats.to(dtype))
    causal = torch.ones(T, T, dtype=torch.bool, device=dev).tril()
    scale = 1.0 / math.sqrt(D)
    k0 = v0 = None
    ks, vs = [], []
    total, accs = 0.0, []
    for i in range(steps):
        shift = i + 1
        tok_in = F.pad(tokens[:, shift: shift + T], (0, T - tokens[:, shift: shift + T].shape[1]))
        lab = F.pad(labels[:, shift: shift + T], (0, T - labels[:, shift: shift + T].shape[1]), value=-1)
        with torch.no_grad():
            emb = embed(tok_in.long()).to(dtype)
        x = torch.cat([ml.input_layernorm(emb), ml.hidden_norm(hidden)], -1)
        q = att.q_proj(x).view(B, T, H, D).transpose(1, 2)
        k = att.k_proj(x).view(B, T, Hkv, D).transpose(1, 2)
        v = att.v_proj(x).view(B, T, Hkv, D).transpose(1, 2)
        pos = (torch.arange(T, device=dev) + i).expand(B, T)
        q, k = head.rope(q, k, pos)
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
        h = h + ml.mlp(ml.post_attention_layernorm(h))
        dl = torch.where(lab >= 0, t2d_index[lab.clamp(min=0).long()], -1)
        sel = dl >= 0
        if sel.any():
            logits = head.lm_head(head.norm(h[sel]))
            total = total + decay ** i * F.cross_entropy(logits, dl[sel])
            accs.append((logits.argmax(-1) == dl[sel]).float().mean().item())
        else:
            accs.append(float("nan"))
        hidden = h
    return total, accs


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
          clip=0.5, ckpt_every=50, seed=0, init_from=None, log=print):
    """Train (or resume) a head on `seqs`; writes out/config.json + model.safetensors and out/train_state.pt.
    init_from: a saved head to start from instead of the target's readout. The draft vocabulary is still chosen from
    `seqs`; lm_head rows of tokens the saved head also has are copied, new tokens start from the target's rows."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    dev = target.device
    rng = random.Random(seed)
    state_path = out / "train_state.pt"
    state = torch.load(state_path, weights_only=False) if state_path.exists() else None
    if state:
        draft_ids = state["draft_ids"]
    else:
        draft_ids, _ = draft_vocab_from_data(seqs, draft_vocab, target.config.vocab_size)
    head = init_head(target, draft_ids, seed)
    if init_from and not state:
        _load_shared(head, Eagle3Head.from_pretrained(init_from))
        log(f"starting from the head in {init_from}")
    head = head.to(dev).train()
    opt = torch.optim.AdamW(head.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    per_epoch = len(_batches(seqs, max_tokens, random.Random(0)))
    total = max(1, int(epochs * per_epoch))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / max(1, warmup * total)) * (
        0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, s / total)))))
    step, history = 0, []
    if state:
        head.load_state_dict(state["head"])
        opt.load_state_dict(state["opt"])
        sched.load_state_dict(state["sched"])
        step, history = state["step"], state["history"]
        rng.setstate(state["rng"])
        log(f"resumed at step {step}/{total}")
    embed = target.model.embed_tokens
    bar = tqdm(total=total, initial=step, desc="train eagle3", unit="step")
    queue = []
    t0 = time.time()
    while step < total:
        if not queue:
            queue = _batches(seqs, max_tokens, rng)
        idx = queue.pop()
        tokens, feats, labels = _collate(seqs, idx, dev)
        loss, accs = ttt_loss(head, embed, tokens, feats, labels, ttt_steps)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), clip)
        opt.step()
        sched.step()
        step += 1
        history.append(dict(step=step, loss=loss.item(), acc=accs))
        bar.update(1)
        bar.set_postfix(loss=f"{history[-1]['loss']:.3f}", acc="/".join(f"{a:.2f}" for a in accs))
        if step % ckpt_every == 0 or step == total:
            tmp = state_path.with_suffix(".tmp")
            torch.save(dict(head=head.state_dict(), opt=opt.state_dict(), sched=sched.state_dict(), step=step,
                            history=history, rng=rng.getstate(), draft_ids=draft_ids), tmp)
            tmp.rename(state_path)
            head.save_pretrained(out)
    bar.close()
    head.save_pretrained(out)
    (out / "train_log.json").write_text(json.dumps(dict(steps=step, epochs=epochs, sequences=len(seqs),
                                                        tokens=sum(len(s["tokens"]) for s in seqs),
                                                        draft_vocab=len(draft_ids), ttt_steps=ttt_steps, lr=lr,
                                                        wall_s=time.time() - t0, last=history[-20:])))
    return head.eval(), history


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
    ap.add_argument("--ttt-steps", type=int, default=5)
    ap.add_argument("--init-from", help="start from this saved head (fine-tune) instead of the target's readout; "
                    "lm_head rows of tokens both vocabularies share are kept")
    a = ap.parse_args(argv)
    if a.skip_prompts < 0 or a.prompts < 1:
        ap.error("--skip-prompts must be >= 0 and --prompts >= 1")
    target = load_target(a.target)
    data = Path(a.data or Path("data") / target.name)
    if not (data / "meta.json").exists():
        if a.prompts_file:
            prompts = [json.loads(line)["prompt"] for line in open(a.prompts_file) if line.strip()]
        else:
            prompts = [p["prompt"] for p in training_prompts(a.skip_prompts + a.prompts)[a.skip_prompts:]]
        generate_dataset(target, prompts, data, max_new_tokens=a.max_new_tokens, batch_size=a.gen_batch)
    seqs = load_dataset(data)
    print(f"{len(seqs)} sequences, {sum(len(s['tokens']) for s in seqs)} tokens", flush=True)
    train(target, seqs, a.out, draft_vocab=a.draft_vocab, epochs=a.epochs, max_tokens=a.max_tokens, lr=a.lr,
          ttt_steps=a.ttt_steps, init_from=a.init_from)


if __name__ == "__main__":
    main()

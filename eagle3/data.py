"""Self-distillation data: the target answers prompts (batched; greedy, plus a sampled share) and we keep, per
sequence, the token ids, the target's EAGLE-3 features (float16) and its argmax at every response position.

Features come for free from the decode itself (every forward returns them), so no second pass is needed. Output is
written in shards of `shard_size` prompts; finished shards are skipped on restart (resumable)."""
import json
from pathlib import Path

import torch
from tqdm import tqdm

from .hardware import row_chunk
from .layers import row_chunks
from .target import pad_prompts
from .verify import greedy, warp


@torch.no_grad()
def answer_batch(target, prompts, max_new_tokens, sample_rows, temperature=0.7, generator=None):
    """Decode a batch with plain autoregressive steps. prompts: strings or chats (lists of messages); temperature:
    one for all sampled rows, or one per row. Returns dicts with tokens [L], feats [L-1, 3h] (feature of each token
    that was fed), labels [L-1] (target argmax after each position; -1 inside the prompt), prompt_len and
    temperature (0.0 for a greedy row)."""
    model, dev = target.model, target.device
    temps = [float(t) for t in temperature] if isinstance(temperature, (list, tuple)) else [temperature] * len(prompts)
    # greedy rows divide by 1: their draw is discarded, but a zero would put NaNs into the batch's multinomial
    temp = torch.tensor([t if s else 1.0 for t, s in zip(temps, sample_rows)], device=dev)[:, None]
    ids = [target.encode_prompt(p) for p in prompts]
    B = len(ids)
    tokens, lens, pos, mask = pad_prompts(ids, dev)
    T = tokens.shape[1]
    cache = model.new_cache(B, T + max_new_tokens + 1)
    logits, feats = model(tokens, pos, cache, mask, logits_at=(lens - 1)[:, None])
    cache.lens.copy_(lens)
    seq_feats = [[feats[b, : lens[b]].half().cpu()] for b in range(B)]
    seq_labels = [[-1] * (int(lens[b]) - 1) for b in range(B)]
    out_tok = [[] for _ in range(B)]
    live = list(range(B))  # batch row -> sequence; finished rows leave the batch
    sample = torch.tensor(sample_rows, device=dev)
    eos = set(target.eos_ids)
    for step in range(max_new_tokens):
        lg = logits[:, -1]
        greedy = lg.argmax(-1)
        drawn = torch.multinomial(warp(lg, temp), 1, generator=generator)[:, 0] if sample.any() else greedy
        nxt = torch.where(sample, drawn, greedy)
        g, n = greedy.tolist(), nxt.tolist()
        keep = []
        for i, b in enumerate(live):
            seq_labels[b].append(g[i])
            out_tok[b].append(n[i])
            if n[i] not in eos:
                keep.append(i)
        if not keep or step == max_new_tokens - 1:
            break
        if len(keep) < len(live):
            cache.keep(keep)
            idx = torch.tensor(keep, device=dev)
            nxt, sample, temp, live = nxt[idx], sample[idx], temp[idx], [live[i] for i in keep]
        logits, feats = model(nxt[:, None], cache.lens[:, None], cache,
                              torch.ones(len(live), 1, 1, dtype=torch.bool, device=dev))
        cache.lens += 1
        f = feats[:, 0].half().cpu()
        for i, b in enumerate(live):
            seq_feats[b].append(f[i: i + 1])
    out = []
    for b in range(B):
        toks = ids[b] + out_tok[b]
        f = torch.cat(seq_feats[b])[: len(toks) - 1]
        out.append(dict(tokens=torch.tensor(toks, dtype=torch.int32), feats=f,
                        labels=torch.tensor(seq_labels[b][: len(toks) - 1], dtype=torch.int32), prompt_len=len(ids[b]),
                        temperature=temps[b] if sample_rows[b] else 0.0))
    return out


def prompt_chars(prompt):
    """Length of a prompt or of a chat's messages, to batch prompts of similar length."""
    return len(prompt) if isinstance(prompt, str) else sum(len(m["content"]) for m in prompt)


def answer_shard(target, prompts, path, max_new_tokens, batch_size, sample_rows, temperatures, generator, bar=None,
                 features=True):
    """Answer `prompts` and save them as one shard at `path` (atomically: an interrupted shard is redone, never
    half-read). sample_rows / temperatures: per prompt. features=False keeps only the token ids, prompt length and
    temperature of each answer (a few KB, small enough to commit); `featurize` recomputes the rest. Runs in row
    chunks where the device has them (hardware.row_chunk), as featurize does: the same numerics, and the int4 kernel
    is several times slower over a batch's prompt rows."""
    order = sorted(range(len(prompts)), key=lambda i: prompt_chars(prompts[i]))  # similar lengths: less padding
    seqs = [None] * len(prompts)
    chunk = row_chunk(target.model)
    for i in range(0, len(order), batch_size):
        idx = order[i: i + batch_size]
        with row_chunks(chunk):
            answers = answer_batch(target, [prompts[j] for j in idx], max_new_tokens, [sample_rows[j] for j in idx],
                                   [temperatures[j] for j in idx], generator)
        for j, r in zip(idx, answers):
            seqs[j] = r if features else {k: r[k] for k in ("tokens", "prompt_len", "temperature")}
        if bar is not None:
            bar.update(len(idx))
            bar.set_postfix(tokens=sum(len(x["tokens"]) for x in seqs if x is not None))
    tmp = Path(path).with_suffix(".tmp")
    torch.save(seqs, tmp)
    tmp.rename(path)
    return seqs


def generate_dataset(target, prompts, out_dir, max_new_tokens=160, batch_size=16, sample_share=0.25,
                     temperature=0.7, shard_size=128, seed=0):
    """Answer `prompts` (strings or chats) with the target and write shards under out_dir. Resumable."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator(device=target.device).manual_seed(seed)
    n_shards = (len(prompts) + shard_size - 1) // shard_size
    bar = tqdm(total=len(prompts), desc="self-distillation", unit="prompt")
    for s in range(n_shards):
        path = out_dir / f"shard_{s:05d}.pt"
        chunk = prompts[s * shard_size: (s + 1) * shard_size]
        if path.exists():
            bar.update(len(chunk))
            continue
        rows = [(s * shard_size + j) % int(1 / sample_share) == 0 if sample_share else False for j in range(len(chunk))]
        answer_shard(target, chunk, path, max_new_tokens, batch_size, rows, [temperature] * len(chunk), gen, bar)
    bar.close()
    (out_dir / "meta.json").write_text(json.dumps(dict(target=target.name, prompts=len(prompts),
                                                       max_new_tokens=max_new_tokens, sample_share=sample_share,
                                                       temperature=temperature, feature_layers=target.config.feature_layers)))


@torch.no_grad()
def featurize(target, seqs, max_tokens=2048):
    """Add `feats` and `labels` (as answer_batch returns them) to token-only records: one prefill per sequence, in
    batches of about max_tokens padded tokens. A prefill computes every position's features and argmax at once, so
    the features cost a fraction of the decode that made the answer. Prefills run in row chunks where the device
    has them (hardware.row_chunk: dense GEMMs, ~4x faster than the int4 kernel over hundreds of rows)."""
    model, dev = target.model, target.device
    with row_chunks(row_chunk(model)):
        return _featurize(model, dev, seqs, max_tokens)


def _featurize(model, dev, seqs, max_tokens):
    out = [dict(s) for s in seqs]
    order = sorted(range(len(out)), key=lambda i: len(out[i]["tokens"]))
    i = 0
    while i < len(order):
        n = 1
        while i + n < len(order) and (n + 1) * len(out[order[i + n]]["tokens"]) <= max_tokens:
            n += 1
        idx = order[i: i + n]
        tokens, lens, pos, mask = pad_prompts([out[j]["tokens"].tolist() for j in idx], dev)
        # Logits only where a label is taken (the answer's positions, from the prompt's last token on): the prompts
        # are most of the tokens, and the lm_head over every position was a quarter of the prefill.
        first = torch.tensor([out[j]["prompt_len"] - 1 for j in idx], device=dev)
        at = torch.minimum(first[:, None] + torch.arange(int((lens - 1 - first).max()), device=dev), lens[:, None] - 2)
        logits, feats = model(tokens, pos, model.new_cache(len(idx), tokens.shape[1]), mask, logits_at=at)
        picks = greedy(logits)  # the engine's own greedy pick (verify.greedy)
        for r, j in enumerate(idx):
            L, p = int(lens[r]), out[j]["prompt_len"]
            labels = torch.full((L - 1,), -1, dtype=torch.int32)  # no loss inside the prompt, as answer_batch marks
            labels[p - 1:] = picks[r, : L - p].to(torch.int32).cpu()
            out[j].update(feats=feats[r, : L - 1].half().cpu(), labels=labels)
        i += n
    return out


def load_dataset(data_dir, target=None):
    """Every shard's records. Memory-mapped: tensors are read from disk when used, so a data set larger than RAM
    (tens of GB of features for tens of thousands of long prompts) can still be trained on. Token-only shards (see
    answer_shard) get their features from `target` once, cached under data_dir/features/ (never committed)."""
    seqs = []
    for f in sorted(Path(data_dir).glob("shard_*.pt")):
        records = torch.load(f, weights_only=True, mmap=True)
        if records and "feats" not in records[0]:
            cached = Path(data_dir) / "features" / f.name
            if not cached.exists():
                if target is None:
                    raise ValueError(f"{f} holds token ids only: pass the target to compute its features")
                cached.parent.mkdir(exist_ok=True)
                tmp = cached.with_suffix(".tmp")
                torch.save(featurize(target, records), tmp)
                tmp.rename(cached)
            records = torch.load(cached, weights_only=True, mmap=True)
        seqs.extend(records)
    return seqs

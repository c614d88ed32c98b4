"""eagle3.datagen on the tiny random target: an interrupted run resumes without redoing finished shards and ends with
the same data as an uninterrupted one; chats follow each shard; the manifest counts what was generated; the data
directory trains."""
import json
import shutil

import pytest
import torch

import eagle3.data
from eagle3 import load_target
from eagle3.data import load_dataset
from eagle3.datagen import generate, load_or_make_plan, main, spread
from eagle3.train import train

# 4 text prompts in shards of 2, each followed by 2 chats
SETTINGS = dict(sources=["stdlib", "chat"], n=8, seed=0, target="tiny", max_new_tokens=4, max_prompt_tokens=300,
                shard_size=2, batch_size=8, sample_share=0.5, temperature=[0.7, 1.0])


ANSWER_BATCH = eagle3.data.answer_batch


@pytest.fixture(scope="module")
def target():
    return load_target("tiny")


def _count_calls(monkeypatch, fail_at=None):
    """Record the prompts each answer_batch call gets; raise KeyboardInterrupt (a kill) at call number fail_at."""
    calls, real = [], ANSWER_BATCH

    def counted(target, prompts, *args, **kw):
        if len(calls) + 1 == fail_at:
            raise KeyboardInterrupt
        calls.append(prompts)
        return real(target, prompts, *args, **kw)
    monkeypatch.setattr(eagle3.data, "answer_batch", counted)
    return calls


def _tokens(path):
    return [r["tokens"].tolist() for r in torch.load(path, weights_only=True)]


def test_resume_skips_finished_shards_and_gives_the_same_data(target, tmp_path, monkeypatch):
    first = _count_calls(monkeypatch, fail_at=3)  # shard 0, its chats, then killed in shard 1
    with pytest.raises(KeyboardInterrupt):
        generate(target, tmp_path / "run", SETTINGS)
    run = tmp_path / "run"
    assert sorted(p.name for p in run.glob("shard_*.pt")) == ["shard_00000.pt", "shard_00000_chat.pt"]
    assert (run / "meta.json").exists()  # eagle3.train can use the finished shards, and never regenerates here
    done = {p.name: p.stat().st_mtime_ns for p in run.glob("shard_*.pt")}
    plan = [json.loads(line)["prompt"] for line in (run / "prompts.jsonl").read_text().splitlines()]

    again = _count_calls(monkeypatch)
    generate(target, run, SETTINGS)
    assert {p.name: p.stat().st_mtime_ns for p in run.glob("shard_*.pt") if p.name in done} == done
    answered = [p for call in again for p in call]
    assert not set(map(json.dumps, plan[:2])) & set(map(json.dumps, answered))  # shard 0 was not answered again
    assert len(first) == 2 and len(answered) == 4  # 2 text prompts + 2 chats in each half

    monkeypatch.setattr(eagle3.data, "answer_batch", ANSWER_BATCH)
    straight = tmp_path / "straight"
    straight.mkdir()
    for name in ("plan.json", "prompts.jsonl", "manifest.json"):  # the same plan (making one is tested above)
        shutil.copy(run / name, straight / name)
    generate(target, straight, SETTINGS)
    for p in sorted(run.glob("shard_*.pt")):
        assert _tokens(p) == _tokens(tmp_path / "straight" / p.name), p.name


def test_chats_manifest_and_training(target, tmp_path):
    out = tmp_path / "data"
    generate(target, out, SETTINGS)
    manifest = json.loads((out / "manifest.json").read_text())
    rows = [json.loads(line) for line in (out / "prompts.jsonl").read_text().splitlines()]
    chats = [json.loads(line) for f in sorted(out.glob("*_chat.jsonl")) for line in f.read_text().splitlines()]
    assert manifest["sources"] == {"stdlib": len(rows), "chat": len(chats)} == {"stdlib": 4, "chat": 4}
    assert all(c[-2]["role"] == "assistant" and c[-1]["role"] == "user" for c in chats)
    seqs = load_dataset(out, target)
    assert len(seqs) == manifest["prompts"] == 8
    text_shards = [r for f in sorted(out.glob("shard_?????.pt")) for r in torch.load(f, weights_only=True)]
    assert manifest["prompt_tokens"] == sum(r["prompt_len"] for r in text_shards) == sum(
        len(target.encode_prompt(r["prompt"])) for r in rows)
    temps = [s["temperature"] for s in seqs]
    assert 0.0 in temps and any(0.7 <= t <= 1.0 for t in temps)
    _, hist = train(target, seqs, tmp_path / "head", draft_vocab=64, epochs=1, max_tokens=4000, ttt_steps=1,
                    log=lambda *_: None)
    assert hist and all(h["loss"] == h["loss"] for h in hist)  # trains, no NaN


def test_a_rerun_with_other_settings_is_refused(target, tmp_path):
    load_or_make_plan(target, tmp_path, SETTINGS)
    with pytest.raises(SystemExit):
        generate(target, tmp_path, {**SETTINGS, "seed": 1})


def test_dry_run_writes_only_the_plan(tmp_path, capsys):
    main(["--out", str(tmp_path), "--target", "tiny", "--sources", "stdlib,chat", "--n", "6", "--dry-run"])
    assert json.loads(capsys.readouterr().out)["sources"] == {"stdlib": 3, "chat": 3}
    assert not list(tmp_path.glob("shard_*")) and (tmp_path / "plan.json").exists()
    assert (tmp_path / "meta.json").exists()  # eagle3.train --data here will not generate data of its own


def test_spread():
    assert spread(5, [3, 2]) == [3, 2] and spread(3, [4, 4, 4, 1]) == [0, 1, 1, 1] and sum(spread(7, [5] * 9)) == 7


def test_token_only_shards_get_the_features_decoding_gave(target, tmp_path):
    """Shards hold token ids only; featurize() recomputes, by one prefill, the features and labels that answer_batch
    collected while decoding (the float64 tiny target: equal to rounding), and load_dataset caches them."""
    prompts = ["Summarise: the cat sat.", "List two colours.", "Why is the sky blue?"]
    gen = torch.Generator().manual_seed(0)
    full = eagle3.data.answer_batch(target, prompts, 6, [False, True, False], 0.8, gen)
    slim = [{k: r[k] for k in ("tokens", "prompt_len", "temperature")} for r in full]
    for got, want in zip(eagle3.data.featurize(target, slim, max_tokens=64), full):
        assert torch.allclose(got["feats"].float(), want["feats"].float(), atol=1e-3)
        assert torch.equal(got["labels"], want["labels"])
    eagle3.data.answer_shard(target, prompts, tmp_path / "shard_00000.pt", 6, 8, [False] * 3, [0.8] * 3, gen,
                             features=False)
    assert "feats" not in torch.load(tmp_path / "shard_00000.pt", weights_only=True)[0]
    with pytest.raises(ValueError):
        load_dataset(tmp_path)
    seqs = load_dataset(tmp_path, target)
    assert (tmp_path / "features" / "shard_00000.pt").exists() and all("feats" in s for s in seqs)

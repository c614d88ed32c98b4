"""Training: the unrolled training-time-test forward equals what the head computes at inference, loss goes down,
checkpoints resume, and the shipped head for the default target beats an untrained one."""
import pytest
import torch

from eagle3 import Eagle3Head, HeadConfig, SpeculativeDecoder, load_target
from eagle3.data import answer_batch
from eagle3.decoder import default_head_path
from eagle3.prompts import heldout_prompts
from eagle3.train import crop_prompts, draft_vocab_from_data, init_head, main, train, ttt_loss


@pytest.fixture(scope="module")
def tiny_data():
    target = load_target("tiny")
    prompts = [f"prompt number {i} about {w}" for i, w in enumerate(["cats", "dogs", "tea", "rain"] * 6)]
    return target, answer_batch(target, prompts, 24, [i % 3 == 0 for i in range(len(prompts))])


def test_ttt_unroll_matches_inference(tiny_data):
    target, seqs = tiny_data
    s = seqs[0]
    head = Eagle3Head.random(HeadConfig.for_target(target.config), seed=3, scale=0.3).double()
    tokens, feats, labels = s["tokens"][None].long(), s["feats"][None].double(), s["labels"][None].long()
    T = labels.shape[1]
    embed = target.model.embed_tokens
    # inference path: head prefill over pairs (features at t, token t+1)
    cache = head.new_cache(1, T + 4)
    causal = torch.ones(T, T, dtype=torch.bool).tril()[None]
    out0 = head(embed(tokens[:, 1:T + 1]), head.fc(feats), torch.arange(T)[None], cache, causal)
    # a depth-2 tree node at anchor t: input (token t+2, step-0 output at t), sees pairs 0..t and itself
    t = T - 5
    cache.lens[:] = t + 1
    out1 = head(embed(tokens[:, t + 2: t + 3]), out0[:, t: t + 1], torch.tensor([[t + 1]]), cache,
                torch.ones(1, 1, 1, dtype=torch.bool))
    # training path: make every position a loss position and read the logits through a hook
    labels = torch.where(torch.arange(T)[None] >= 1, labels.clamp(min=0), -1)
    seen = []
    hook = head.lm_head.register_forward_hook(lambda m, i, o: seen.append(o.detach()))
    try:
        ttt_loss(head.train(), embed, tokens, feats, labels, steps=2)
    finally:
        hook.remove()
    ref0 = head.logits(out0)[0, : T - 1]          # step 0 rows: anchors with a label at t+1
    assert torch.allclose(seen[0], ref0, atol=1e-9)
    ref1 = head.logits(out1)[0, 0]                 # step 1 rows: anchors 0..T-3; take anchor t
    assert torch.allclose(seen[1][t], ref1, atol=1e-9)


def test_training_reduces_loss_and_resumes(tiny_data, tmp_path):
    target, seqs = tiny_data
    _, hist = train(target, seqs, tmp_path, draft_vocab=200, epochs=12, max_tokens=400, lr=3e-3, ttt_steps=3,
                    ckpt_every=5, log=lambda *_: None)
    first = sum(h["loss"] for h in hist[:3]) / 3
    last = sum(h["loss"] for h in hist[-3:]) / 3
    assert last < 0.7 * first, (first, last)
    head = Eagle3Head.from_pretrained(tmp_path)
    assert head.config.draft_vocab_size == 200 and int(head.t2d.sum()) == 200
    # resume: a finished run picks up at its last step and does not train further
    _, hist2 = train(target, seqs, tmp_path, draft_vocab=200, epochs=12, max_tokens=400, lr=3e-3, ttt_steps=3,
                     ckpt_every=5, log=lambda *_: None)
    assert len(hist2) == len(hist)


def test_fine_tuning_starts_from_the_given_head(tiny_data, tmp_path):
    target, seqs = tiny_data
    train(target, seqs, tmp_path / "a", draft_vocab=150, epochs=3, max_tokens=400, lr=3e-3, ttt_steps=2,
          log=lambda *_: None)
    start = Eagle3Head.from_pretrained(tmp_path / "a")
    for size in (150, 200):  # same vocabulary, and a larger one that must keep the shared rows
        _, hist = train(target, seqs, tmp_path / f"b{size}", draft_vocab=size, epochs=0.01, max_tokens=400,
                        lr=1e-9, ttt_steps=2, init_from=tmp_path / "a", log=lambda *_: None)
        assert len(hist) == 1
        tuned = Eagle3Head.from_pretrained(tmp_path / f"b{size}")  # one step at lr 1e-9: still the given head
        assert tuned.config.draft_vocab_size == size
        for name, a in start.state_dict().items():
            if name not in ("lm_head.weight", "d2t", "t2d"):
                assert torch.allclose(a.float(), tuned.state_dict()[name].float(), atol=1e-3), name
        old = start.to_target_ids(torch.arange(150)).tolist()
        new = tuned.to_target_ids(torch.arange(size)).tolist()
        assert set(old) <= set(new)
        for i, tok in enumerate(old):
            assert torch.allclose(start.lm_head.weight[i].float(), tuned.lm_head.weight[new.index(tok)].float(),
                                  atol=1e-3)


def test_fine_tuning_can_keep_the_given_heads_vocabulary(tiny_data, tmp_path):
    target, seqs = tiny_data
    train(target, seqs, tmp_path / "a", draft_vocab=150, epochs=1, max_tokens=400, lr=3e-3, ttt_steps=2,
          log=lambda *_: None)
    start = Eagle3Head.from_pretrained(tmp_path / "a")
    picked, _ = train(target, seqs[: len(seqs) // 3], tmp_path / "picked", draft_vocab=150, epochs=0.01,
                      max_tokens=400, lr=1e-9, ttt_steps=2, init_from=tmp_path / "a", log=lambda *_: None)
    kept, _ = train(target, seqs[: len(seqs) // 3], tmp_path / "kept", draft_vocab=150, epochs=0.01, max_tokens=400,
                    lr=1e-9, ttt_steps=2, init_from=tmp_path / "a", keep_vocab=True, log=lambda *_: None)
    vocab = lambda h: h.to_target_ids(torch.arange(h.config.draft_vocab_size)).tolist()  # noqa: E731
    assert vocab(picked) != vocab(start)  # a third of the data picks another vocabulary ...
    assert vocab(kept) == vocab(start)  # ... unless told to keep the head's
    assert torch.allclose(kept.lm_head.weight.float(), start.lm_head.weight.float(), atol=1e-3)


def test_trained_tiny_head_accepts_more_and_stays_lossless(tiny_data, tmp_path):
    target, seqs = tiny_data
    head, _ = train(target, seqs, tmp_path, draft_vocab=259, epochs=25, max_tokens=600, lr=3e-3, ttt_steps=3,
                    ckpt_every=1000, log=lambda *_: None)
    prompts = [f"prompt number {i} about cats" for i in range(6)]
    untrained = SpeculativeDecoder(target, parallel_degree=3, depth=4, total_tokens=12, adaptive=False)
    trained = SpeculativeDecoder(target, draft=head, parallel_degree=3, depth=4, total_tokens=12, adaptive=False)
    van = untrained.generate(prompts, max_new_tokens=24, speculative=False)
    a = untrained.generate(prompts, max_new_tokens=24)
    b = trained.generate(prompts, max_new_tokens=24)
    assert [r.token_ids for r in a] == [r.token_ids for r in b] == [r.token_ids for r in van]
    assert trained.last_stats["accept_length"] > untrained.last_stats["accept_length"] + 0.3


def test_shipped_head_beats_untrained_on_default_target():
    """The committed head, on held-out prompts it never trained on: lossless and far more tokens per forward than
    an untrained head (measured at shipping: tau 2.67 vs 1.10 on these six)."""
    target = load_target()
    path = default_head_path(target)
    assert (path / "model.safetensors").exists(), f"no shipped head at {path}"
    prompts = [p["prompt"] for p in heldout_prompts()][:6]
    shipped = SpeculativeDecoder(target, adaptive=False)
    untrained = SpeculativeDecoder(target, draft=init_head(target, torch.arange(4096)), adaptive=False)
    van = shipped.generate(prompts, max_new_tokens=48, speculative=False)
    a = shipped.generate(prompts, max_new_tokens=48, batch_size=1)  # batch 1: the configured tree, not a shrunk one
    untrained.generate(prompts, max_new_tokens=48, batch_size=1)
    assert [r.token_ids for r in a] == [r.token_ids for r in van]
    assert shipped.last_stats["accept_length"] > 1.8
    assert shipped.last_stats["accept_length"] > untrained.last_stats["accept_length"] + 0.7


def test_crop_prompts_keeps_every_answer_label_aligned(tiny_data):
    _, seqs = tiny_data
    s = seqs[0]
    (c,) = crop_prompts([s], 2)
    k = s["prompt_len"] - 2
    assert k > 0 and c["prompt_len"] == 2 and len(c["tokens"]) == len(s["tokens"]) - k
    # every label (the answer's) survives, beside the same token and feature it had
    assert (c["labels"] >= 0).sum() == (s["labels"] >= 0).sum()
    assert torch.equal(c["tokens"], s["tokens"][k:]) and torch.equal(c["labels"], s["labels"][k:])
    assert torch.equal(c["feats"], s["feats"][k:]) and len(c["feats"]) == len(c["tokens"]) - 1
    assert crop_prompts([s], 10_000)[0] is s and crop_prompts([s], None)[0] is s


@pytest.mark.parametrize("bad", [["--skip-prompts", "-1"], ["--prompts", "0"]])
def test_cli_rejects_bad_prompt_counts_before_loading(bad, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["--out", str(tmp_path / "h"), *bad])
    assert e.value.code == 2 and "--skip-prompts must be >= 0" in capsys.readouterr().err

"""Training recipe options: EAGLE 3.1 norms (config round trip, old configs unchanged, training = inference), the
tv / lk losses and the target distribution they read, a 7-step unroll, held-out simulated tau and best-epoch
selection, and the CLI that sets them."""
import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from eagle3 import Eagle3Head, HeadConfig, SpeculativeDecoder, load_target
from eagle3.data import answer_batch
from eagle3.train import main, simulated_tau, step_loss, target_draft_logits, train, ttt_loss
from eagle3_helpers import random_prompts, small_vocab_target

QUIET = dict(log=lambda *_: None)


@pytest.fixture(scope="module")
def tiny_data():
    target = load_target("tiny")
    prompts = [f"prompt number {i} about {w}" for i, w in enumerate(["cats", "dogs", "tea", "rain"] * 4)]
    # mostly greedy answers: held-out tau counts chains whose inputs are the target's greedy tokens
    return target, answer_batch(target, prompts, 20, [i % 8 == 7 for i in range(len(prompts))])


def _head(target_config, eagle31, seed=3):
    """A random head whose norms are not all ones, so that a norm applied in the wrong place shows."""
    c = HeadConfig.for_target(target_config)
    c.fc_norm = c.norm_output = eagle31
    head = Eagle3Head.random(c, seed=seed, scale=0.3).double()
    g = torch.Generator().manual_seed(seed)
    for name, p in head.named_parameters():
        if "norm" in name:
            p.data = 1 + 0.2 * torch.randn(p.shape, generator=g, dtype=p.dtype)
    return head


# ---------------------------------------------------------------- EAGLE 3.1 norms


def test_eagle31_config_and_weights_round_trip(tmp_path):
    head = _head(load_target("tiny").config, eagle31=True).float()
    head.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["fc_norm"] is True and cfg["norm_output"] is True
    sd = load_file(str(tmp_path / "model.safetensors"))
    assert {f"fc_norm.{i}.weight" for i in range(3)} <= set(sd) and sd["fc_norm.0.weight"].shape == (64,)
    back = Eagle3Head.from_pretrained(tmp_path)
    assert back.config == head.config
    feats = torch.randn(2, 5, 3 * 64)
    assert torch.allclose(back.project(feats), head.project(feats), atol=1e-2)


def test_fc_norm_normalises_each_feature_and_norm_output_hands_on_the_normed_state():
    cfg = load_target("tiny").config
    new, old = _head(cfg, eagle31=True), _head(cfg, eagle31=False)
    feats = torch.randn(1, 4, 3 * 64, dtype=torch.float64)
    scaled = feats * torch.tensor([10.0] * 64 + [4.0] * 64 + [3.0] * 64, dtype=torch.float64)
    assert torch.allclose(new.project(scaled), new.project(feats), atol=1e-4)  # each third's scale is gone
    assert not torch.allclose(old.project(scaled), old.project(feats), atol=1e-3)
    h = torch.randn(1, 4, 64, dtype=torch.float64)
    assert torch.equal(new.output(h), new.norm(h)) and torch.equal(new.logits(new.output(h)), new.lm_head(new.norm(h)))
    assert old.output(h) is h and torch.equal(old.logits(h), old.lm_head(old.norm(h)))


def test_a_config_without_the_fields_loads_as_plain_eagle3(tmp_path):
    """Heads saved before EAGLE 3.1 (the shipped one) have neither field: both off, no extra tensors, and the head
    computes exactly the EAGLE-3 formulas it computed before."""
    head = _head(load_target("tiny").config, eagle31=False).float()
    head.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    del cfg["fc_norm"], cfg["norm_output"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    old = Eagle3Head.from_pretrained(tmp_path)
    assert not old.config.fc_norm and not old.config.norm_output and not hasattr(old, "fc_norm")
    feats, h = torch.randn(2, 3, 3 * 64), torch.randn(2, 3, 64)
    assert torch.equal(old.project(feats), old.fc(feats))
    assert torch.equal(old.logits(old.output(h)), old.lm_head(old.norm(h)))


def test_shipped_head_config_has_eagle31_off():
    path = Path(__file__).resolve().parents[1] / "models" / "eagle3-smollm2-135m-instruct"
    cfg = HeadConfig.from_dict(json.loads((path / "config.json").read_text()))
    assert not cfg.fc_norm and not cfg.norm_output


@pytest.mark.parametrize("eagle31", [False, True], ids=["eagle3", "eagle31"])
def test_seven_step_unroll_matches_an_inference_chain(tiny_data, eagle31):
    """Every step of a 7-step training unroll computes what the decoder's head computes for a chain of drafts at
    the same anchor (tree.draft_tree with k = 1), with and without the 3.1 norms."""
    target, seqs = tiny_data
    s, steps = seqs[0], 7
    head = _head(target.config, eagle31)
    tokens, feats, labels = s["tokens"][None].long(), s["feats"][None].double(), s["labels"][None].long()
    T = labels.shape[1]
    t = T - steps - 2
    embed = target.model.embed_tokens
    chain = _inference_chain(head, embed, tokens, feats, t, steps)
    labels = torch.where(torch.arange(T)[None] >= 1, labels.clamp(min=0), -1)  # every position a loss position
    seen = []
    hook = head.lm_head.register_forward_hook(lambda m, i, o: seen.append(o.detach()))
    try:
        ttt_loss(head.train(), embed, tokens, feats, labels, steps=steps)
    finally:
        hook.remove()
    assert len(seen) == steps
    for i in range(steps):
        assert torch.allclose(seen[i][t], chain[i], atol=1e-9), i


def _inference_chain(head, embed, tokens, feats, t, steps):
    """Logits of a chain of `steps` drafts at anchor t, through the decoder's calls: prefill of the context pairs,
    then depth d reads (token t+d+1, the previous output) at position t+d and sees the chain's earlier slots."""
    T = feats.shape[1]
    cache = head.new_cache(1, T + steps + 2)
    causal = torch.ones(T, T, dtype=torch.bool).tril()[None]
    out = head(embed(tokens[:, 1:T + 1]), head.project(feats), torch.arange(T)[None], cache, causal)
    cache.lens[:] = t + 1
    prev, logits = out[:, t: t + 1], [head.logits(out[0, t])]
    for d in range(1, steps):
        prev = head(embed(tokens[:, t + d + 1: t + d + 2]), prev, torch.tensor([[t + d]]), cache,
                    torch.ones(1, 1, d, dtype=torch.bool), offset=d - 1)
        logits.append(head.logits(prev[0, 0]))
    return logits


def test_eagle31_head_decodes_losslessly(tmp_path):
    target = small_vocab_target(vocab=8)
    c = HeadConfig.for_target(target.config)
    c.fc_norm = c.norm_output = True
    Eagle3Head.random(c, seed=2, scale=0.3).save_pretrained(tmp_path)
    dec = SpeculativeDecoder(target, draft=str(tmp_path), parallel_degree=3, depth=4, total_tokens=12, adaptive=False)
    assert dec.head.config.fc_norm
    prompts = random_prompts(10, 8, seed=5)
    van = dec.generate_ids(prompts, max_new_tokens=16, speculative=False)
    spec = dec.generate_ids(prompts, max_new_tokens=16, batch_size=4)
    assert [r.token_ids for r in spec] == [r.token_ids for r in van]
    assert dec.last_stats["accept_length"] > 1.1


# ---------------------------------------------------------------- losses and the target distribution


def test_target_logits_are_recomputed_exactly_from_the_high_feature():
    """The high feature is the input of layer n-3: running the target's last layers from it gives the target's own
    logits (unrounded features: to float64 precision; the stored float16 ones: the same argmax almost everywhere)."""
    target = load_target("tiny")
    ids = torch.tensor([[256, 72, 101, 108, 108, 111, 32, 116, 104, 101, 114, 101, 33, 10, 65, 66]])
    T = ids.shape[1]
    cache = target.model.new_cache(1, T)
    logits, feats = target.model(ids, torch.arange(T)[None], cache, torch.ones(T, T, dtype=torch.bool).tril()[None])
    vocab = torch.arange(target.config.vocab_size)
    assert torch.allclose(target_draft_logits(target, feats, vocab), logits.float(), atol=1e-4)
    assert torch.allclose(target_draft_logits(target, feats, vocab[50:90]), logits[..., 50:90].float(), atol=1e-4)
    # and not what norm + lm_head make of the high feature itself (the shortcut this replaces)
    high = feats[..., 2 * 64:]
    assert not torch.allclose(target.model.lm_head(target.model.norm(high)).float(), logits.float(), atol=1e-2)


def test_target_logits_from_stored_features_match_the_stored_labels(tiny_data):
    target, seqs = tiny_data
    agree = total = 0
    for s in seqs:
        tl = target_draft_logits(target, s["feats"][None].float(), torch.arange(target.config.vocab_size))[0]
        resp = s["labels"] >= 0
        agree += int((tl.argmax(-1)[resp] == s["labels"][resp].long()).sum())
        total += int(resp.sum())
    assert agree / total > 0.98, agree / total


def test_step_losses_by_hand():
    p = torch.tensor([[0.5, 0.5, 1e-30]]).log()            # target: two tokens, equally likely
    q = torch.tensor([[0.9, 0.1, 1e-30]]).log()            # draft
    assert math.isclose(step_loss("tv", q, None, p).item(), 1 - (0.5 + 0.1), abs_tol=1e-6)
    assert step_loss("tv", p, None, p).item() < 1e-6 and step_loss("lk", p, None, p).item() < 1e-6
    kl = 0.5 * math.log(0.5 / 0.9) + 0.5 * math.log(0.5 / 0.1)
    w = math.exp(-3 * 0.6)
    assert math.isclose(step_loss("lk", q, None, p).item(), w * kl + (1 - w) * 0.4, rel_tol=1e-5)
    assert math.isclose(step_loss("ce", q, torch.tensor([1]), None).item(), -math.log(0.1), rel_tol=1e-5)


def test_tv_loss_has_a_gradient_towards_the_target():
    p = torch.tensor([[2.0, 0.0, -1.0]])
    q = torch.zeros(1, 3, requires_grad=True)
    step_loss("tv", q, None, p).backward()
    assert q.grad[0, 0] < 0 < q.grad[0, 2]                 # raise the target's likely token, lower its unlikely one


# ---------------------------------------------------------------- simulated tau and best-epoch selection


def test_simulated_tau_by_hand():
    hits = torch.tensor([[1, 1, 0], [1, 0, 1], [0, 1, 1], [1, 1, 1]], dtype=torch.bool)
    tau, accs = simulated_tau(hits)
    # chains alive after step 0, 1, 2: 3/4, 2/4, 1/4 -> tau = 1 + 1.5; acc_i among the still-alive: 3/4, 2/3, 1/2
    assert math.isclose(tau, 2.5) and all(math.isclose(a, b) for a, b in zip(accs, [0.75, 2 / 3, 0.5]))
    assert math.isclose(tau, 1 + sum(math.prod(accs[: d + 1]) for d in range(3)))
    assert simulated_tau(torch.ones(5, 7, dtype=torch.bool))[0] == 8.0
    assert simulated_tau(torch.zeros(5, 7, dtype=torch.bool))[0] == 1.0


def test_the_best_held_out_epoch_is_the_one_saved(tiny_data, tmp_path, monkeypatch):
    import eagle3.train as tr
    target, seqs = tiny_data
    taus, snapshots = iter([1.5, 2.5, 2.0]), []

    def fake_tau(head, *args):
        snapshots.append({k: v.detach().clone() for k, v in head.state_dict().items()})
        return next(taus), [0.5]

    monkeypatch.setattr(tr, "heldout_tau", fake_tau)
    head, _ = train(target, seqs, tmp_path, draft_vocab=200, epochs=3, max_tokens=400, lr=3e-3, ttt_steps=2,
                    val_frac=0.25, **QUIET)
    log = json.loads((tmp_path / "train_log.json").read_text())
    assert [e["tau"] for e in log["per_epoch"]] == [1.5, 2.5, 2.0] and [e["epoch"] for e in log["per_epoch"]] == [1, 2, 3]
    assert log["best"]["epoch"] == 2 and log["heldout_sequences"] == 4
    saved = load_file(str(tmp_path / "model.safetensors"))
    for name in ("fc.weight", "midlayer.mlp.down_proj.weight", "lm_head.weight"):
        assert torch.equal(saved[name], snapshots[1][name].half()), name       # epoch 2's weights ...
        assert not torch.equal(saved[name], snapshots[2][name].half()), name   # ... not the last epoch's
        assert torch.equal(head.state_dict()[name], saved[name].float())


def test_an_epoch_without_held_out_chains_does_not_freeze_the_choice():
    from eagle3.train import _better
    nan = float("nan")
    assert _better(dict(tau=2.0), dict(tau=nan)) and _better(dict(tau=nan), dict(tau=2.0))  # no signal: the latest
    assert _better(dict(tau=2.1), dict(tau=2.0)) and not _better(dict(tau=2.0), dict(tau=2.0))
    assert _better(dict(tau=None), dict(tau=None))                                          # no held-out data


def test_held_out_tau_is_logged_per_epoch_and_rises_with_training(tiny_data, tmp_path):
    target, seqs = tiny_data
    train(target, seqs, tmp_path, draft_vocab=259, epochs=8, max_tokens=600, lr=3e-3, ttt_steps=3, val_frac=0.25,
          **QUIET)
    per_epoch = json.loads((tmp_path / "train_log.json").read_text())["per_epoch"]
    assert len(per_epoch) == 8 and all(1.0 <= e["tau"] <= 4.0 and len(e["acc"]) == 3 for e in per_epoch)
    assert per_epoch[-1]["tau"] > per_epoch[0]["tau"]


# ---------------------------------------------------------------- each option trains, saves and reloads


@pytest.mark.parametrize("opts", [dict(loss="tv"), dict(loss="lk"), dict(ttt_steps=7), dict(eagle31=False),
                                  dict(val_frac=0.0)], ids=["tv", "lk", "unroll7", "no-eagle31", "no-val"])
def test_each_option_trains_saves_and_reloads(tiny_data, tmp_path, opts):
    target, seqs = tiny_data
    args = dict(draft_vocab=120, epochs=1, max_tokens=400, lr=3e-3, ttt_steps=2, val_frac=0.25) | opts
    head, hist = train(target, seqs, tmp_path, **args, **QUIET)
    assert all(math.isfinite(h["loss"]) for h in hist) and len(hist[-1]["acc"]) == args["ttt_steps"]
    log = json.loads((tmp_path / "train_log.json").read_text())
    assert log["loss"] == opts.get("loss", "ce") and log["ttt_steps"] == args["ttt_steps"]
    back = Eagle3Head.from_pretrained(tmp_path)
    assert back.config.fc_norm == back.config.norm_output == opts.get("eagle31", True)
    assert back.config.draft_vocab_size == 120
    feats = torch.randn(1, 3, 3 * 64)
    assert torch.allclose(back.project(feats), head.project(feats))
    if args["val_frac"]:
        assert log["heldout_sequences"] == 4 and log["best"]["tau"] >= 1.0
    else:
        assert log["heldout_sequences"] == 0 and log["best"]["tau"] is None


def test_fine_tuning_keeps_the_start_heads_norms(tiny_data, tmp_path):
    target, seqs = tiny_data
    train(target, seqs, tmp_path / "old", draft_vocab=120, epochs=0.2, max_tokens=400, eagle31=False, **QUIET)
    tuned, _ = train(target, seqs, tmp_path / "b", draft_vocab=120, epochs=0.2, max_tokens=400,
                     init_from=tmp_path / "old", **QUIET)
    assert not tuned.config.fc_norm and not tuned.config.norm_output
    fresh, _ = train(target, seqs, tmp_path / "c", draft_vocab=120, epochs=0.2, max_tokens=400, **QUIET)
    assert fresh.config.fc_norm and fresh.config.norm_output


def test_cli_sets_every_recipe_option(tmp_path):
    main(["--target", "tiny", "--out", str(tmp_path / "h"), "--data", str(tmp_path / "d"), "--prompts", "8",
          "--max-new-tokens", "12", "--draft-vocab", "100", "--epochs", "1", "--max-tokens", "300",
          "--unroll", "7", "--loss", "lk", "--val-frac", "0.25"])
    log = json.loads((tmp_path / "h" / "train_log.json").read_text())
    assert (log["ttt_steps"], log["loss"], log["heldout_sequences"], log["eagle31"]) == (7, "lk", 2, True)
    assert json.loads((tmp_path / "h" / "config.json").read_text())["fc_norm"] is True


@pytest.mark.parametrize("bad", [["--unroll", "0"], ["--val-frac", "1"]])
def test_cli_rejects_bad_recipe_options(bad, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["--out", str(tmp_path / "h"), *bad])
    assert e.value.code == 2 and "--unroll must be >= 1" in capsys.readouterr().err

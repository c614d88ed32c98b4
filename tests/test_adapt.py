"""Workload adaptation (eagle3/adapt.py): a job's completed greedy items, decoded by the worker's own code path
against the real database, become training data; the gate installs a better head and refuses a worse one; versions
roll back; the worker's engine moves to a new version between batches and records it per item; the adapted head
stays lossless. The tiny random target (its version 0 is the untrained head) keeps each test to seconds."""
import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import ROOT, RUN_ID, client_for, prompts, submit
from sqlalchemy import select

from api import create_app
from eagle3 import SpeculativeDecoder, heads
from eagle3.adapt import Example, adapt, load_head, measure_tau, sequence_of, split
from jobs import tokenizer
from jobs.adaptation import greedy_items
from jobs.db import session_factory
from jobs.models import Item, ItemResult
from worker import processing
from worker.engine import Engine

FAST = dict(steps=30, lr=3e-3, eval_tokens=32, log=lambda *_: None)  # enough for the tiny target's τ to move


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """The tiny model's ops are too small to split: two threads on a busy 2-core machine made training 7x slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def models_dir(tmp_path, monkeypatch):
    """A head tree of its own: the shipped heads are never touched, and every test starts at version 0."""
    monkeypatch.setenv("EAGLE3_MODELS_DIR", str(tmp_path))
    return tmp_path


@pytest.fixture(scope="module")
def Session(database):
    return session_factory(database)


@pytest.fixture(scope="module")
def decoded_job(Session, tmp_path_factory):
    """A generation job of 12 greedy items and one sampled item, decoded in-process by the worker's processing code
    (its queue has no consumer, so nothing else decodes it). Returns (job id, item ids of the greedy items)."""
    previous = os.environ.get("EAGLE3_MODELS_DIR")
    os.environ["EAGLE3_MODELS_DIR"] = str(tmp_path_factory.mktemp("models"))
    try:
        idle = client_for(create_app({"queue": f"unconsumed-{RUN_ID}"}))
        items = prompts(12) + [{"custom_id": "sampled", "prompt": "Sampled", "temperature": 0.8, "seed": 1}]
        job = submit(idle, {"items": items, "params": {"max_new_tokens": 32}})
        with Session() as session:
            ids = session.scalars(select(Item.id).where(Item.job_id == job["id"]).order_by(Item.idx)).all()
        assert processing.process(Session, Engine("tiny", batch_size=8), list(ids), max_attempts=3) == 13
    finally:
        os.environ.pop("EAGLE3_MODELS_DIR") if previous is None else os.environ.update(EAGLE3_MODELS_DIR=previous)
    return job["id"], list(ids[:12])


@pytest.fixture(scope="module")
def examples(Session, decoded_job):
    with Session() as session:
        return [Example(*row) for row in greedy_items(session, tokenizer.load("tiny"), [decoded_job[0]])]


def run_cli(*args, models):
    return subprocess.run([sys.executable, "-m", "eagle3.adapt", *args], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "EAGLE3_MODELS_DIR": str(models), "OMP_NUM_THREADS": "1"}, timeout=120)


def test_only_completed_greedy_items_are_read_with_the_workers_prompt_ids(Session, decoded_job, examples):
    job_id, greedy_ids = decoded_job
    assert [ex.item_id for ex in examples] == greedy_ids  # the sampled item is left out
    chat = tokenizer.load("tiny")
    with Session() as session:
        first = session.get(Item, greedy_ids[0])
        stored = session.get(ItemResult, greedy_ids[0]).output["token_ids"]
    assert examples[0].prompt_ids == chat.encode_messages(tokenizer.turns(first.prompt, None))
    assert examples[0].output_ids == stored
    with Session() as session:
        assert len(greedy_items(session, chat, [job_id], last=5)) == 5


def test_a_near_tie_broken_the_other_way_keeps_the_sequence_a_foreign_output_is_cut(examples):
    """Labels are always the target's argmax. One disagreeing token (a worker in another numeric mode) keeps the
    whole item; an output that is mostly not the target's is cut before its first disagreement."""
    from eagle3 import load_target

    target = load_target("tiny")
    ex = max(examples, key=lambda e: len(e.output_ids))
    n = len(ex.output_ids)
    assert n >= 20
    seq, kept = sequence_of(target, ex)
    assert kept == n  # the worker's own output: all of it, labels equal to it
    assert seq["labels"][-n:].tolist() == ex.output_ids
    flip = lambda t: (t + 1) % target.config.vocab_size  # noqa: E731
    once = Example(ex.item_id, ex.prompt_ids, ex.output_ids[:9] + [flip(ex.output_ids[9])] + ex.output_ids[10:])
    seq, kept = sequence_of(target, once)
    assert kept == n and seq["labels"][-n:].tolist()[9] == ex.output_ids[9]  # the label is the target's choice
    foreign = Example(ex.item_id, ex.prompt_ids, ex.output_ids[:5] + [flip(t) for t in ex.output_ids[5:]])
    seq, kept = sequence_of(target, foreign)
    assert kept == 5 and len(seq["tokens"]) == len(ex.prompt_ids) + 5


def test_split_keeps_each_item_on_its_side_whatever_comes_with_it():
    many = [Example(i, [1], [2]) for i in range(1000)]
    train, held = split(many, 0.2)
    assert 150 < len(held) < 250 and {ex.item_id for ex in held}.isdisjoint(ex.item_id for ex in train)
    held_ids = {ex.item_id for ex in held}
    later = split(many[500:] + [Example(i, [1], [2]) for i in range(1000, 1500)], 0.2)[1]  # another night's items
    assert {ex.item_id for ex in later if ex.item_id < 1000} == {i for i in held_ids if i >= 500}
    few_train, few_held = split(many[:2], 0.2)  # too few for the hash range: still one on each side
    assert len(few_train) == len(few_held) == 1


def test_cli_adapts_from_a_jobs_items_lists_and_rolls_back(models_dir, decoded_job):
    done = run_cli("--target", "tiny", "--job", decoded_job[0], "--steps", "30", "--lr", "3e-3",
                   "--eval-tokens", "32", models=models_dir)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["train_items"] + report["heldout_items"] == 12 and report["parent"] == 0
    assert report["tau_candidate"] > report["tau_current"] and report["installed"] and report["version"] == 1
    assert "held-out τ: current (version 0)" in done.stdout  # both numbers printed
    root = models_dir / "eagle3-tiny"
    assert heads.current_version(root) == 1 and (root / "versions" / "1" / "model.safetensors").exists()

    listing = run_cli("--target", "tiny", "--list", models=models_dir).stdout.splitlines()
    assert listing[2].split()[:5] == ["1", "*", "0", f"{report['tau_candidate']:.3f}", f"{report['tau_current']:.3f}"]

    back = run_cli("--target", "tiny", "--rollback", models=models_dir)
    assert back.returncode == 0 and "version 1 -> 0" in back.stdout
    assert heads.current_version(root) == 0
    again = run_cli("--target", "tiny", "--rollback", models=models_dir)
    assert again.returncode != 0 and "nothing to roll back to" in again.stderr


def test_gate_installs_a_better_head_and_refuses_a_worse_one(models_dir, examples):
    target = Engine("tiny", batch_size=1).target
    better = adapt(target, examples, **FAST)
    assert better.installed and better.version == 1 and better.tau_candidate > better.tau_current
    assert better.same_output  # lossless: both heads decoded the held-out items to the same tokens
    # A degenerate candidate: a learning rate that wrecks the head in a few steps
    worse = adapt(target, examples, **{**FAST, "steps": 5, "lr": 10.0})
    assert worse.parent == 1 and worse.tau_current == pytest.approx(better.tau_candidate)
    assert worse.tau_candidate < worse.tau_current and not worse.installed and worse.version is None
    root = models_dir / "eagle3-tiny"
    assert heads.current_version(root) == 1 and heads.list_versions(root) == [0, 1]


def test_adapted_head_gives_output_identical_to_vanilla(models_dir, examples):
    target = Engine("tiny", batch_size=1).target
    assert adapt(target, examples, **FAST).installed
    # draft=None: the current version, the adapted head; the fixed tree, so every round drafts
    decoder = SpeculativeDecoder(target, adaptive=False)
    chat = tokenizer.load("tiny")
    ids = [ex.prompt_ids for ex in examples] + [chat.encode_messages([{"role": "user", "content": f"New {i}"}])
                                                for i in range(4)]
    spec = decoder.generate_ids(ids, max_new_tokens=48, batch_size=4)
    assert decoder.last_stats["accept_length"] > 1.5  # drafts are accepted, so verification is exercised
    vanilla = decoder.generate_ids(ids, max_new_tokens=48, batch_size=4, speculative=False)
    assert [r.token_ids for r in spec] == [r.token_ids for r in vanilla]


def test_engine_reloads_the_head_between_batches_and_records_it(models_dir, Session, examples):
    engine = Engine("tiny", batch_size=8)
    idle = client_for(create_app({"queue": f"unconsumed-{RUN_ID}"}))

    def batch():
        job = submit(idle, {"items": prompts(3, "Reload"), "params": {"max_new_tokens": 16}})
        with Session() as session:
            ids = session.scalars(select(Item.id).where(Item.job_id == job["id"])).all()
        processing.process(Session, engine, list(ids), max_attempts=3)
        with Session() as session:
            return [r.stats for r in session.scalars(select(ItemResult).where(ItemResult.item_id.in_(ids)))]

    assert {s["head_version"] for s in batch()} == {0}
    decoder = engine.decoder(4, 1.0)
    assert not engine.refresh_head() and engine.decoder(4, 1.0) is decoder  # unchanged pointer: nothing reloaded
    report = adapt(engine.target, examples, **FAST)
    assert report.installed
    stats = batch()  # the same engine: no restart
    assert {s["head_version"] for s in stats} == {1}
    assert engine.decoder(4, 1.0) is not decoder
    installed = load_head(engine.target, 1)
    loaded = engine.decoder(4, 1.0).head
    assert (loaded.lm_head.weight.float().cpu() - installed.lm_head.weight).abs().max() < 1e-6
    heads.rollback(models_dir / "eagle3-tiny")
    assert {s["head_version"] for s in batch()} == {0}


def test_measure_tau_is_an_actual_decode(models_dir, examples):
    target = Engine("tiny", batch_size=1).target
    tau, outputs = measure_tau(target, load_head(target, 0), examples[:3], max_new_tokens=32)
    assert tau >= 1.0
    assert outputs == [ex.output_ids[:32] for ex in examples[:3]]  # the target's greedy tokens, as the worker's


def test_beat_sends_adapt_head_on_the_configured_cron_only():
    from celery.schedules import crontab

    from jobs.config import Settings
    from jobs.queue import ADAPT_TASK, make_celery

    assert "adapt-head" not in make_celery(Settings(adapt_schedule="")).conf.beat_schedule
    app = make_celery(Settings(adapt_schedule="0 3 * * *", queue="q"))
    entry = app.conf.beat_schedule["adapt-head"]
    assert entry["task"] == ADAPT_TASK and entry["schedule"] == crontab(minute="0", hour="3")
    assert app.conf.task_routes[ADAPT_TASK] == {"queue": "q.adapt"}
    with pytest.raises(ValueError, match="5 cron fields"):
        make_celery(Settings(adapt_schedule="nightly"))


def test_versions_roll_back_through_their_parents(models_dir):
    from eagle3.adapt import install

    target = Engine("tiny", batch_size=1).target
    root = models_dir / "eagle3-tiny"
    stamp = heads.pointer_stamp(root)
    assert stamp is None and heads.current_version(root) == 0
    assert install(target, load_head(target, 0), {"parent": 0, "tau": 1.5, "parent_tau": 1.0}) == 1
    assert heads.pointer_stamp(root) != stamp
    assert install(target, load_head(target, 1), {"parent": 1, "tau": 1.7, "parent_tau": 1.5}) == 2
    assert heads.list_versions(root) == [0, 1, 2] and heads.current_version(root) == 2
    assert heads.rollback(root) == (2, 1) and heads.rollback(root) == (1, 0)
    with pytest.raises(ValueError, match="no head version 7"):
        heads.set_current(root, 7)
    assert heads.current_version(root) == 0 and not list(root.glob(".current.*"))  # no temporary file left behind

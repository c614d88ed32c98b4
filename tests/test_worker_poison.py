"""A poison item: one item of a batch that the decoder rejects fails alone, with its error message, at its first
delivery; the other items of its batch complete.

How an item the API accepted can still be rejected by the decoder: the API checks prompt lengths against the
target it loads itself. If a deployment moves the workers to a target with a smaller context (or a larger draft
tree) while jobs are queued, items validated against the old target reach a decoder that refuses them. The test
builds exactly that state: it submits through an API whose queue no worker reads, lengthens one stored prompt past
the worker's context, then sends the job's items to the real worker's queue. No fault-injection hook in the code.

An item that instead kills its worker every time is failed after ITEM_MAX_ATTEMPTS deliveries
(tests/test_worker_idempotency.py::test_an_item_delivered_too_often_is_failed, tests/test_worker_crash.py).
"""
from __future__ import annotations

from conftest import RUN_ID, all_results, client_for, submit, wait_for
from sqlalchemy import select, update

from api import create_app
from jobs.db import session_factory
from jobs.models import Item, Job
from jobs.queue import send_items


def test_a_poison_item_fails_alone_and_its_batch_completes(app, client, worker, database):
    Session = session_factory(database)
    idle = client_for(create_app({"queue": f"unconsumed-{RUN_ID}"}))
    created = submit(idle, {"items": [{"custom_id": f"p{i}", "prompt": f"Poison batch {i}"} for i in range(8)],
                            "params": {"max_new_tokens": 8}})
    with Session.begin() as session:
        poison = session.scalar(select(Item.id).where(Item.job_id == created["id"], Item.custom_id == "p3"))
        session.execute(update(Item).where(Item.id == poison).values(prompt="x" * 1100))  # > the tiny context
        ids = session.scalars(select(Item.id).where(Item.job_id == created["id"]).order_by(Item.idx)).all()
        priority = session.get(Job, created["id"]).priority
    send_items(app.extensions["jobs"].celery, [(i, priority) for i in ids])  # to the worker's queue

    job = wait_for(client, created["id"], timeout=90)
    assert job["status"] == "completed"
    assert job["item_counts"] == {"total": 8, "completed": 7, "failed": 1, "cancelled": 0}
    results = {r["custom_id"]: r for r in all_results(client, created["id"])}
    assert len(results) == 8
    bad = results.pop("p3")
    assert bad["status"] == "failed" and bad["output"] is None
    assert bad["error"]["message"].startswith("ValueError: prompts[0]") and "context" in bad["error"]["message"]
    assert all(r["status"] == "completed" and r["output"]["token_ids"] for r in results.values())
    with Session() as session:  # a decode error is final at once; nothing was delivered twice
        assert set(session.scalars(select(Item.attempts).where(Item.job_id == created["id"]))) == {1}
    assert "decoding its items one by one" in worker.tail(200_000)

"""Redelivery and failure handling of the batch processing, run in-process against the real database.

Jobs are submitted through an API whose queue no worker consumes, so only this test decodes them."""
import pytest
from conftest import RUN_ID, client_for, submit
from sqlalchemy import func, select, update

from api import create_app
from jobs.db import session_factory
from jobs.models import Item, ItemResult, Job
from worker import processing
from worker.engine import Engine

MAX_ATTEMPTS = 3


@pytest.fixture(scope="module")
def engine():
    return Engine("tiny", batch_size=8)


@pytest.fixture(scope="module")
def idle(database):
    return client_for(create_app({"queue": f"unconsumed-{RUN_ID}"}))


@pytest.fixture
def Session(database):
    return session_factory(database)


def new_job(idle, Session, n=3, **params):
    created = submit(idle, {"items": [{"prompt": f"Redelivered {i}"} for i in range(n)],
                            "params": {"max_new_tokens": 4, **params}})
    with Session() as session:
        ids = session.scalars(select(Item.id).where(Item.job_id == created["id"]).order_by(Item.idx)).all()
    return created["id"], list(ids)


def snapshot(Session, job_id):
    with Session() as session:
        job = session.get(Job, job_id)
        results = session.scalar(select(func.count()).select_from(ItemResult).join(Item)
                                 .where(Item.job_id == job_id))
        return {"status": job.status, "completed": job.completed_items, "failed": job.failed_items,
                "new_tokens": job.new_tokens, "forwards": job.target_forwards, "results": results}


def test_a_redelivered_batch_neither_loses_nor_duplicates(idle, Session, engine):
    job_id, ids = new_job(idle, Session)
    assert processing.process(Session, engine, ids, MAX_ATTEMPTS) == 3
    first = snapshot(Session, job_id)
    assert first["status"] == "completed" and first["completed"] == first["results"] == 3
    assert processing.process(Session, engine, ids, MAX_ATTEMPTS) == 0  # the same messages again
    assert processing.process(Session, engine, ids + ids, MAX_ATTEMPTS) == 0
    assert snapshot(Session, job_id) == first  # counts and stats not doubled


def test_duplicate_messages_in_one_batch_decode_once(idle, Session, engine):
    job_id, ids = new_job(idle, Session, n=2)
    assert processing.process(Session, engine, ids + ids[:1], MAX_ATTEMPTS) == 2
    assert snapshot(Session, job_id)["results"] == 2


def test_an_item_left_running_by_a_lost_worker_is_decoded_again(idle, Session, engine):
    job_id, ids = new_job(idle, Session, n=2)
    with Session.begin() as session:  # what a worker killed mid-batch leaves behind
        session.execute(update(Item).where(Item.id.in_(ids)).values(status="running", attempts=1))
    assert processing.process(Session, engine, ids, MAX_ATTEMPTS) == 2
    with Session() as session:
        assert session.scalars(select(Item.attempts).where(Item.id.in_(ids))).all() == [2, 2]
    assert snapshot(Session, job_id)["status"] == "completed"


def test_the_last_allowed_delivery_still_decodes(idle, Session, engine):
    job_id, ids = new_job(idle, Session, n=1)
    with Session.begin() as session:
        session.execute(update(Item).where(Item.id.in_(ids)).values(status="running", attempts=MAX_ATTEMPTS - 1))
    assert processing.process(Session, engine, ids, MAX_ATTEMPTS) == 1
    assert snapshot(Session, job_id)["status"] == "completed"
    with Session() as session:
        assert session.get(Item, ids[0]).attempts == MAX_ATTEMPTS


def test_an_item_delivered_too_often_is_failed(idle, Session, engine):
    job_id, ids = new_job(idle, Session, n=1)
    with Session.begin() as session:
        session.execute(update(Item).where(Item.id.in_(ids)).values(status="running", attempts=MAX_ATTEMPTS))
    assert processing.process(Session, engine, ids, MAX_ATTEMPTS) == 1
    assert snapshot(Session, job_id)["status"] == "failed"
    with Session() as session:
        assert "gave up after 3 deliveries" in session.get(ItemResult, ids[0]).error


def test_a_bad_item_fails_alone(idle, Session, engine):
    job_id, ids = new_job(idle, Session, n=3)
    with Session.begin() as session:  # a prompt the decoder rejects (longer than the context), past the API
        session.execute(update(Item).where(Item.id == ids[1]).values(prompt="x" * 5000))
    assert processing.process(Session, engine, ids, MAX_ATTEMPTS) == 3
    state = snapshot(Session, job_id)
    assert state["status"] == "completed" and state["completed"] == 2 and state["failed"] == 1
    with Session() as session:
        error = session.get(ItemResult, ids[1]).error
        assert error.startswith("ValueError: prompts[0]") and "context" in error
        assert session.get(ItemResult, ids[0]).output["token_ids"]


def test_cancelled_items_are_not_decoded(idle, Session, engine):
    job_id, ids = new_job(idle, Session, n=2)
    assert idle.post(f"/v1/jobs/{job_id}/cancel").get_json()["status"] == "cancelled"
    assert processing.process(Session, engine, ids, MAX_ATTEMPTS) == 0
    with Session() as session:
        assert session.scalars(select(Item.attempts).where(Item.id.in_(ids))).all() == [0, 0]

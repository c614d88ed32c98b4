"""Identical submissions at the same instant with one new Idempotency-Key: exactly one job is stored, every request
gets it back (202), none gets a 5xx, and nothing of the losers is stored half-way. The requests run in threads
against the app, each with its own database connection, so the unique (key, Idempotency-Key) really is raced."""
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import client_for
from sqlalchemy import func, select

from jobs.db import session_factory
from jobs.models import Item, Job

REQUESTS = 12


def race(app, bodies: list[dict], key: str) -> list:
    """POST every body at once (a barrier releases them together); returns the responses."""
    barrier = threading.Barrier(len(bodies))

    def post(body):
        client = client_for(app)
        barrier.wait()
        return client.post("/v1/jobs", json=body, headers={"Idempotency-Key": key})

    with ThreadPoolExecutor(len(bodies)) as pool:
        return list(pool.map(post, bodies))


@pytest.mark.parametrize("round_", range(3))
def test_identical_concurrent_submissions_make_one_job(app, database, round_):
    key = f"race-{uuid.uuid4()}"
    body = {"items": [{"prompt": f"Race {i}"} for i in range(3)], "metadata": {"round": str(round_)}}
    responses = race(app, [body] * REQUESTS, key)
    assert [r.status_code for r in responses] == [202] * REQUESTS, [r.get_json() for r in responses]
    ids = {r.get_json()["id"] for r in responses}
    assert len(ids) == 1
    assert sum(r.headers.get("Idempotent-Replayed") == "true" for r in responses) == REQUESTS - 1
    with session_factory(database)() as session:
        jobs = session.scalars(select(Job.id).where(Job.idempotency_key == key)).all()
        assert [str(j) for j in jobs] == list(ids)
        assert session.scalar(select(func.count()).where(Item.job_id == jobs[0])) == 3
    client_for(app).post(f"/v1/jobs/{jobs[0]}/cancel")


def test_different_concurrent_bodies_with_one_key_are_one_job_and_409s(app, database):
    key = f"race-{uuid.uuid4()}"
    bodies = [{"items": [{"prompt": f"Body {n}"}]} for n in range(REQUESTS)]
    responses = race(app, bodies, key)
    statuses = sorted(r.status_code for r in responses)
    assert statuses == [202] + [409] * (REQUESTS - 1), [r.get_json() for r in responses]
    winner = next(r.get_json()["id"] for r in responses if r.status_code == 202)
    assert {r.get_json()["job_id"] for r in responses if r.status_code == 409} == {winner}
    with session_factory(database)() as session:
        assert session.scalar(select(func.count()).where(Job.idempotency_key == key)) == 1
        assert session.scalar(select(func.count()).where(Item.job_id == uuid.UUID(winner))) == 1
    client_for(app).post(f"/v1/jobs/{winner}/cancel")

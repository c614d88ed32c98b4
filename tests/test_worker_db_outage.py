"""Postgres goes away while the worker decodes: the worker neither crashes nor loses a result.

The worker reaches Postgres through a loopback TCP proxy that the test cuts (every connection closed, new ones
refused) and restores (tests/fault_helpers.py), so the outage hits only this worker and not the Postgres server that
other test sessions share. The API and the test's own checks talk to Postgres directly.

- A short outage (shorter than DB_RETRY_S): the worker retries writing the decoded batch and writes it after
  recovery; nothing is decoded twice.
- A long outage: the write gives up, the batch's items are handed back to the queue with a delay, the next batch's
  claim fails and is handed back too; after recovery all of them are decoded and written once.
"""
from __future__ import annotations

import os
import time

import psutil
import pytest
from conftest import QUEUE, SERVER_URL, WorkerProcess, client_for, submit, wait_for
from fault_helpers import TcpProxy
from sqlalchemy import func, select
from sqlalchemy.engine import make_url

from api import create_app
from jobs.db import session_factory
from jobs.models import Item, ItemResult


@pytest.fixture
def proxied_worker(database, tmp_path):
    proxy = TcpProxy(SERVER_URL.host or "127.0.0.1", SERVER_URL.port or 5432)
    url = make_url(database).set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
    queue = f"{QUEUE}-pg"
    worker = WorkerProcess(queue, tmp_path / "worker.log", DATABASE_URL=url, BATCH_SIZE="4", DB_RETRY_S="3")
    try:
        worker.wait_ready()
        yield worker, proxy, client_for(create_app({"queue": queue}))
    finally:
        worker.stop()
        proxy.close()


# On the tiny target 16 tokens decode in ~50 ms, and a batch could be claimed, decoded and written between two polls
# for "running" (seen in CI); 512 tokens keep a batch running for about a second.
DECODE_TOKENS = 512


def wait_until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def state_of(Session, job_id) -> dict:
    with Session() as session:
        rows = session.execute(select(Item.id, Item.status, Item.attempts, func.count(ItemResult.item_id))
                               .outerjoin(ItemResult).where(Item.job_id == job_id).group_by(Item.id)).all()
    return {r.id: (r.status, r.attempts, r[3]) for r in rows}


def test_the_worker_rides_out_a_postgres_outage(proxied_worker, database):
    worker, proxy, client = proxied_worker
    Session = session_factory(database)
    pids = (worker.proc.pid, [c.pid for c in psutil.Process(worker.proc.pid).children()])

    def running(job_id):
        return lambda: any(s == "running" for s, _, _ in state_of(Session, job_id).values())

    # A short outage: the batch is written once Postgres is back, without decoding it again.
    short = submit(client, {"items": [{"prompt": f"Blip {i}"} for i in range(4)],
                            "params": {"max_new_tokens": DECODE_TOKENS}})
    wait_until(running(short["id"]), 30, "first batch claimed")
    proxy.cut()
    wait_until(lambda: b"retrying the write of 4 results" in worker.log_path.read_bytes(), 60, "a write retried")
    proxy.restore()
    job = wait_for(client, short["id"], timeout=60)
    assert job["status"] == "completed" and job["item_counts"]["completed"] == 4
    assert set(state_of(Session, short["id"]).values()) == {("completed", 1, 1)}

    # A long outage: the write gives up after DB_RETRY_S, the next batch cannot even be claimed; both are handed back.
    long = submit(client, {"items": [{"prompt": f"Outage {i}"} for i in range(8)],
                           "params": {"max_new_tokens": DECODE_TOKENS}})
    wait_until(running(long["id"]), 30, "first batch claimed")
    proxy.cut()
    wait_until(lambda: worker.log_path.read_bytes().count(b"re-sent them with a delay") >= 2, 60,
               "both batches handed back")
    time.sleep(2)
    proxy.restore()
    job = wait_for(client, long["id"], timeout=90)
    assert job["status"] == "completed" and job["item_counts"]["completed"] == 8, job
    final = state_of(Session, long["id"]).values()
    assert all(status == "completed" and results == 1 for status, _, results in final)
    assert max(attempts for _, attempts, _ in final) == 2  # the first batch was claimed, then decoded once more

    # No crash and no crash loop: the same worker and pool child did all of it.
    assert worker.proc.poll() is None
    assert (worker.proc.pid, [c.pid for c in psutil.Process(worker.proc.pid).children()]) == pids
    assert os.path.getsize(worker.log_path) < 2_000_000

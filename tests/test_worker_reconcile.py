"""The reconciler and a Redis restart: Redis here keeps nothing on disk, so a restart forgets every queued message;
the reconciler finds the items Postgres still has queued and sends them again, and no item is lost or duplicated.

Everything runs on a private redis-server (random port, no persistence) and a private database, so restarting
Redis cannot disturb other test sessions or CI on this machine (tests/fault_helpers.py)."""
from __future__ import annotations

import re
import time

import pytest
from conftest import RUN_ID, WorkerProcess, client_for, submit, wait_for
from fault_helpers import RedisServer, private_database
from kombu import Exchange, Queue
from sqlalchemy import func, select, text, update

from api import create_app
from jobs.db import session_factory
from jobs.models import Item, ItemResult, Job
from jobs.queue import RECONCILE_TASK, items_in_broker, make_celery
from jobs.reconcile import reconcile


@pytest.fixture(scope="module")
def stack(database, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("reconcile")
    redis = RedisServer(workdir)
    try:
        with private_database("rc") as url:
            yield {"redis": redis, "database_url": url, "workdir": workdir}
    finally:
        redis.stop()


def app_on(stack, queue: str):
    return create_app({"database_url": stack["database_url"], "redis_url": stack["redis"].url, "queue": queue})


def item_ids(Session, job_id) -> list[int]:
    with Session() as session:
        return list(session.scalars(select(Item.id).where(Item.job_id == job_id).order_by(Item.idx)))


def test_the_reconciler_resends_exactly_the_items_redis_lost(stack):
    queue = f"rc-unit-{RUN_ID}"  # nobody consumes it: the messages stay where the test puts them
    app = app_on(stack, queue)
    state = app.extensions["jobs"]
    Session, celery = state.Session, state.celery
    client = client_for(app)
    ids = item_ids(Session, submit(client, {"items": [{"prompt": f"Lost {i}"} for i in range(6)]})["id"])
    assert items_in_broker(celery) == set(ids)

    def run():
        return reconcile(Session, celery, after_s=60, running_after_s=3600, confirm_s=0.1)

    with Session.begin() as session:  # all sent long ago; Redis still holds every message: nothing to do
        session.execute(update(Item).where(Item.id.in_(ids)).values(enqueued_at=func.now() - text("interval '1 hour'")))
    assert run().resent == 0

    stack["redis"].client().flushall()  # what a restart without persistence leaves
    with Session.begin() as session:
        old = func.now() - text("interval '2 hours'")
        session.execute(update(Item).where(Item.id == ids[0]).values(status="running", attempts=1, started_at=old))
        session.execute(update(Item).where(Item.id == ids[1]).values(status="running", attempts=1,
                                                                      started_at=func.now()))  # a live worker's
        session.execute(update(Item).where(Item.id == ids[2]).values(enqueued_at=func.now()))  # just sent
        session.execute(update(Item).where(Item.id == ids[3]).values(enqueued_at=None))  # never sent: requeue_unsent's
    report = run()
    assert (report.queued, report.running) == (2, 1)  # ids[4], ids[5]; and ids[0], abandoned by a lost worker
    assert items_in_broker(celery) == {ids[0], ids[4], ids[5]}
    with Session() as session:
        status = dict(session.execute(select(Item.id, Item.status).where(Item.id.in_(ids))).all())
        assert [status[i] for i in ids] == ["queued", "running", "queued", "queued", "queued", "queued"]
        assert session.get(Item, ids[0]).attempts == 1  # the claim counts the next delivery, not the reconciler

    resent = [ids[0], ids[4], ids[5]]
    with Session.begin() as session:  # sent again long ago, and still held by Redis: left alone
        session.execute(update(Item).where(Item.id.in_(resent))
                        .values(enqueued_at=func.now() - text("interval '1 hour'")))
    assert run().resent == 0

    # A message a worker has taken but not acked (prefetched, or its batch being decoded) counts as in flight.
    stack["redis"].client().flushall()
    celery.send_task("worker.decode_items", args=[ids[4]], queue=queue)
    with celery.connection_for_read() as connection:
        taken = Queue(queue, Exchange(queue), routing_key=queue)(connection.default_channel).get(no_ack=False)
        assert taken is not None and taken.payload[0] == [ids[4]]
        assert items_in_broker(celery) == {ids[4]}  # in kombu's unacked hash now, no longer in the list
        report = run()
    assert report.in_broker == 1 and report.queued == 2  # ids[0] and ids[5]
    assert items_in_broker(celery) == set(resent)


def test_the_beat_schedule_runs_the_reconciler_on_the_maintenance_queue():
    celery = make_celery(create_app().extensions["jobs"].settings)
    entry = celery.conf.beat_schedule["reconcile"]
    assert entry["task"] == RECONCILE_TASK and entry["schedule"] == 60.0
    assert celery.conf.task_routes[RECONCILE_TASK]["queue"].endswith(".maint")


def test_a_redis_restart_loses_no_item(stack):
    """Jobs queued and running when Redis restarts: the batch being decoded finishes and is written; the messages
    Redis held are gone, so the rest of the job would wait forever; the reconciler task sends them again; every item
    ends with exactly one result and the job completes."""
    queue = f"rc-{RUN_ID}"
    app = app_on(stack, queue)
    state = app.extensions["jobs"]
    Session, celery = state.Session, state.celery
    worker = WorkerProcess(queue, stack["workdir"] / "worker.log", REDIS_URL=stack["redis"].url,
                           DATABASE_URL=stack["database_url"], BATCH_SIZE="4", RECONCILE_AFTER_S="1", LEASE_S="3")
    try:
        worker.wait_ready()
        client = client_for(app)
        # 32 items: the worker holds at most 3 batches (the one decoding and 2 x batch_size prefetched), so even when
        # the first batch is done before we look, some messages are still only in Redis when it restarts.
        jobs = [submit(client, {"items": [{"prompt": f"Restart {j}-{i}"} for i in range(16)],
                                "params": {"max_new_tokens": 200}})["id"] for j in range(2)]
        mine = Item.job_id.in_(jobs)
        deadline = time.monotonic() + 30
        while True:  # until the first batch is being decoded
            with Session() as session:
                running = session.scalar(select(func.count()).where(mine, Item.status == "running"))
            if running:
                break
            assert time.monotonic() < deadline
            time.sleep(0.05)

        stack["redis"].restart()
        assert items_in_broker(celery) == set()

        deadline = time.monotonic() + 60
        while True:  # what the worker had (the running batch, its prefetched messages) finishes; the rest is stuck
            with Session() as session:
                counts = dict(session.execute(select(Item.status, func.count()).where(mine).group_by(Item.status)).all())
            if not counts.get("running"):
                time.sleep(2)  # and stays stuck
                with Session() as session:
                    again = dict(session.execute(select(Item.status, func.count()).where(mine).group_by(Item.status)).all())
                if again == counts:
                    break
            assert time.monotonic() < deadline, counts
            time.sleep(0.2)
        lost = counts.get("queued", 0)
        assert lost > 0, counts  # messages really were lost
        assert worker.proc.poll() is None

        celery.send_task(RECONCILE_TASK, queue=queue + ".maint")  # what beat sends every RECONCILE_INTERVAL_S
        for job_id in jobs:
            job = wait_for(client, job_id, timeout=90)
            assert job["status"] == "completed" and job["item_counts"]["completed"] == 16, job
        # Lost: the messages only Redis had (re-sent by the reconciler: no worker leased them), and the batch the
        # worker had handed to its pool but not started (Celery drops it with the old connection; its leases expire
        # and the heartbeat re-sends it). The first test's leftovers share this database, hence >=.
        log = worker.tail(100_000)
        resent = sum(int(n) for n in re.findall(r"reconciler: re-sent (\d+) (?:queued|items whose)", log))
        assert resent >= lost, log[-3000:]
        with Session() as session:
            per_item = session.execute(select(Item.id, func.count(ItemResult.item_id)).outerjoin(ItemResult)
                                       .where(mine).group_by(Item.id)).all()
            assert len(per_item) == 32 and all(n == 1 for _, n in per_item)
            assert session.scalar(select(func.sum(Job.completed_items)).where(Job.id.in_(jobs))) == 32
            assert session.scalar(select(func.max(Item.attempts)).where(mine)) <= 3
        assert worker.proc.poll() is None
    finally:
        worker.stop()

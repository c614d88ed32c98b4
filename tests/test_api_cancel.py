"""Cancel: queued items never run, running ones finish, the job ends 'cancelled'."""
import time

import pytest
from conftest import RUN_ID, all_results, client_for, prompts, submit, wait_for

from api import create_app
from jobs.db import session_factory
from jobs.models import Item
from jobs.queue import celery_app


def test_cancel_queued_job_and_the_worker_skips_its_messages(worker, database, client):
    idle_queue = f"idle-{RUN_ID}"
    idle = client_for(create_app({"queue": idle_queue}))  # its messages wait: no worker consumes this queue yet
    created = submit(idle, {"items": prompts(5, "Cancelled"), "params": {"max_new_tokens": 4}})

    response = idle.post(f"/v1/jobs/{created['id']}/cancel")
    assert response.status_code == 200
    job = response.get_json()
    assert job["status"] == "cancelled" and job["cancel_requested_at"] and job["finished_at"]
    assert job["item_counts"] == {"total": 5, "completed": 0, "failed": 0, "cancelled": 5}
    results = all_results(idle, created["id"])
    assert [r["status"] for r in results] == ["cancelled"] * 5
    assert all(r["output"] is None and r["error"]["message"] == "cancelled before it ran" for r in results)
    assert idle.post(f"/v1/jobs/{created['id']}/cancel").get_json()["status"] == "cancelled"  # idempotent

    # Now let the worker receive those five messages: it must skip them.
    import redis

    broker = redis.Redis.from_url(celery_app.conf.broker_url)
    assert sum(broker.llen(k) for k in broker.scan_iter(match=f"{idle_queue}*")) == 5
    celery_app.control.add_consumer(idle_queue, destination=[worker.name], reply=True, timeout=5)
    try:
        deadline = time.monotonic() + 30
        while sum(broker.llen(k) for k in broker.scan_iter(match=f"{idle_queue}*")) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert sum(broker.llen(k) for k in broker.scan_iter(match=f"{idle_queue}*")) == 0
        time.sleep(1.0)  # flush interval + a batch
    finally:
        celery_app.control.cancel_consumer(idle_queue, destination=[worker.name], reply=True, timeout=5)
    with session_factory(database)() as session:
        attempts = session.query(Item.attempts).filter(Item.job_id == created["id"]).all()
    assert [a for (a,) in attempts] == [0] * 5  # never claimed, never decoded
    assert client.get(f"/v1/jobs/{created['id']}").get_json()["item_counts"]["cancelled"] == 5


def test_cancel_running_job(client, worker):
    # 400 tokens: at 32 the tiny target decoded all three batches of 8 before the cancel landed (a Zen 5 EPYC)
    created = submit(client, {"items": prompts(24, "Long running"), "params": {"max_new_tokens": 400}})
    wait_for(client, created["id"], statuses=("running",), timeout=30)
    response = client.post(f"/v1/jobs/{created['id']}/cancel")
    assert response.status_code == 200
    assert response.get_json()["status"] in ("cancelling", "cancelled")

    job = wait_for(client, created["id"], statuses=("cancelled",), timeout=60)
    counts = job["item_counts"]
    assert counts["completed"] >= 1  # the batch that was running finished
    assert counts["cancelled"] >= 1  # the queued ones did not run
    assert counts["completed"] + counts["cancelled"] == 24 and counts["failed"] == 0
    results = all_results(client, created["id"])
    assert len(results) == 24
    for r in results:
        if r["status"] == "completed":
            assert r["output"]["token_ids"] and r["error"] is None
        else:
            assert r["status"] == "cancelled" and r["output"] is None and r["stats"] is None
    time.sleep(1.0)  # nothing runs after the job is cancelled
    assert client.get(f"/v1/jobs/{created['id']}").get_json()["item_counts"] == counts


def test_cancel_finished_job_is_409(client, worker):
    created = submit(client, {"items": prompts(1, "Quick"), "params": {"max_new_tokens": 2}})
    wait_for(client, created["id"])
    response = client.post(f"/v1/jobs/{created['id']}/cancel")
    assert response.status_code == 409 and response.mimetype == "application/problem+json"
    assert "already completed" in response.get_json()["detail"]

"""A pool child killed mid-batch: its messages are requeued at once and the items decoded again, exactly once each."""
import signal
import time

import psutil
from conftest import submit, wait_for
from sqlalchemy import select

from jobs.db import session_factory
from jobs.models import Item


def test_sigkill_of_the_pool_child_mid_batch_redelivers(client, worker, database):
    Session = session_factory(database)
    created = submit(client, {"items": [{"prompt": f"Crash {i}"} for i in range(2)],
                              "params": {"max_new_tokens": 600}})  # long enough to be killed mid-decode
    deadline = time.monotonic() + 30
    while True:  # until the batch is claimed (and so being decoded)
        with Session() as session:
            attempts = session.scalars(select(Item.attempts).where(Item.job_id == created["id"])).all()
        if attempts == [1, 1]:
            break
        assert time.monotonic() < deadline, attempts
        time.sleep(0.05)
    time.sleep(0.2)
    children = psutil.Process(worker.proc.pid).children()
    assert len(children) == 1
    children[0].send_signal(signal.SIGKILL)

    job = wait_for(client, created["id"], timeout=90)
    assert job["status"] == "completed" and job["item_counts"]["completed"] == 2
    with Session() as session:
        assert session.scalars(select(Item.attempts).where(Item.job_id == created["id"])).all() == [2, 2]
    assert client.get(f"/v1/jobs/{created['id']}/results").get_json()["data"][1]["output"]["token_ids"]

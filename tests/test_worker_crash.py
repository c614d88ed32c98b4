"""A pool child killed mid-batch: its messages are requeued at once and the items decoded again, exactly once each."""
import signal
import time

import psutil
from conftest import submit, wait_for
from sqlalchemy import func, select

from jobs.db import session_factory
from jobs.models import Item, ItemResult


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
    with Session() as session:  # the two messages may have come as two batches: the first may be done already
        done = set(session.scalars(select(ItemResult.item_id).join(Item).where(Item.job_id == created["id"])))
        ids = session.scalars(select(Item.id).where(Item.job_id == created["id"]).order_by(Item.id)).all()
    assert len(done) < 2  # at least one item was in the killed batch

    job = wait_for(client, created["id"], timeout=90)
    assert job["status"] == "completed"
    assert job["item_counts"] == {"total": 2, "completed": 2, "failed": 0, "cancelled": 0}
    with Session() as session:
        attempts = dict(session.execute(select(Item.id, Item.attempts).where(Item.job_id == created["id"])).all())
        assert attempts == {i: 1 if i in done else 2 for i in ids}  # the killed batch's items were decoded again
        per_item = session.execute(select(Item.id, func.count(ItemResult.item_id)).outerjoin(ItemResult)
                                   .where(Item.job_id == created["id"]).group_by(Item.id)).all()
    assert len(per_item) == 2 and all(n == 1 for _, n in per_item)  # none lost, none duplicated
    results = client.get(f"/v1/jobs/{created['id']}/results").get_json()["data"]
    assert [r["status"] for r in results] == ["completed", "completed"]
    assert all(r["output"]["token_ids"] for r in results)
    new_children = psutil.Process(worker.proc.pid).children()  # a new pool child did the work
    assert len(new_children) == 1 and new_children[0].pid != children[0].pid

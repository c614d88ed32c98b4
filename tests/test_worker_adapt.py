"""A real Celery worker runs the adapt_head task on its .adapt queue, and decodes the next job with the new head
version, without a restart; the items' stats say which version decoded them."""
import os
import subprocess
import sys
import time

import pytest
from conftest import ROOT, RUN_ID, all_results, client_for, prompts, submit, wait_for

from api import create_app
from eagle3 import heads
from jobs.queue import ADAPT_TASK, celery_app

QUEUE = f"test-{RUN_ID}-adapt"


@pytest.fixture
def adapt_worker(database, tmp_path):
    """A worker on its own queues (decode, .maint and .adapt) and its own head tree."""
    log_path = tmp_path / "worker.log"
    log = open(log_path, "wb")
    env = {**os.environ, "CELERY_QUEUE": QUEUE, "EAGLE3_MODELS_DIR": str(tmp_path / "models"),
           "OMP_NUM_THREADS": "1"}  # the tiny model trains 7x faster on one thread of a busy 2-core machine
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "worker", "worker", "-Q", f"{QUEUE},{QUEUE}.maint,{QUEUE}.adapt",
         "--pool=prefork", "--concurrency=1", "-n", f"{QUEUE}@{os.uname().nodename}", "--loglevel=INFO",
         "--without-gossip", "--without-mingle"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 90
        while not (b"loaded target" in log_path.read_bytes() and b" ready." in log_path.read_bytes()):
            assert proc.poll() is None and time.monotonic() < deadline, log_path.read_bytes()[-3000:].decode()
            time.sleep(0.2)
        yield proc, tmp_path / "models" / "eagle3-tiny", log_path
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def versions_of(client, job_id):
    return {r["stats"]["head_version"] for r in all_results(client, job_id)}


def test_worker_adapts_and_decodes_the_next_batch_with_the_new_head(adapt_worker):
    proc, root, log_path = adapt_worker
    client = client_for(create_app({"queue": QUEUE}))
    first = submit(client, {"items": prompts(10), "params": {"max_new_tokens": 32}})
    assert wait_for(client, first["id"], timeout=60)["status"] == "completed"
    assert versions_of(client, first["id"]) == {0}

    celery_app.send_task(ADAPT_TASK, kwargs={"job_ids": [first["id"]], "steps": 30, "lr": 3e-3},
                         queue=f"{QUEUE}.adapt")
    deadline = time.monotonic() + 90
    while heads.current_version(root) != 1:
        assert time.monotonic() < deadline, log_path.read_bytes()[-3000:].decode()
        time.sleep(0.3)
    assert b"adapt_head: held-out tau" in log_path.read_bytes()

    second = submit(client, {"items": prompts(4, "Again"), "params": {"max_new_tokens": 8}})
    assert wait_for(client, second["id"], timeout=60)["status"] == "completed"
    assert versions_of(client, second["id"]) == {1}

    heads.rollback(root)  # from outside the worker (as `python -m eagle3.adapt --rollback` does)
    third = submit(client, {"items": prompts(4, "Rolled back"), "params": {"max_new_tokens": 8}})
    assert wait_for(client, third["id"], timeout=60)["status"] == "completed"
    assert versions_of(client, third["id"]) == {0}
    assert proc.poll() is None  # the same worker, never restarted

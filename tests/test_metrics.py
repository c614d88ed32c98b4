"""Prometheus metrics of the API and of the worker, JSON logs with job ids, and the alert-rule file."""
import io
import json
import logging
import math
import re
import socket
import urllib.request

import pytest
import yaml
from conftest import ROOT, RUN_ID, client_for, prompts, submit, wait_for
from prometheus_client import REGISTRY
from sqlalchemy import select

from api import create_app
from jobs.db import session_factory
from jobs.logs import JsonFormatter
from jobs.models import Item
from worker import metrics, processing


def sample(name, **labels):
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_api_metrics_use_route_templates_and_count_statuses(client, anon_client):
    missing = "00000000-0000-0000-0000-00000000beef"
    before = sample("eagle3_api_requests_total", method="GET", route="/v1/jobs/<job_id>", status="404")
    assert client.get(f"/v1/jobs/{missing}").status_code == 404
    assert anon_client.get("/v1/jobs").status_code == 401
    response = anon_client.get("/metrics")  # open, like /health
    assert response.status_code == 200 and response.mimetype == "text/plain"
    text = response.get_data(as_text=True)
    assert sample("eagle3_api_requests_total", method="GET", route="/v1/jobs/<job_id>", status="404") == before + 1
    assert sample("eagle3_api_requests_total", method="GET", route="/v1/jobs", status="401") >= 1
    assert 'eagle3_api_request_duration_seconds_bucket{le="0.005",method="GET",route="/v1/jobs/<job_id>"}' in text
    assert missing not in text  # raw paths never become labels
    assert 'eagle3_queue_scrape_ok{source="redis"} 1.0' in text
    assert 'eagle3_queue_scrape_ok{source="postgres"} 1.0' in text


def test_queue_depth_from_redis_and_postgres(database):
    queue = f"metrics-idle-{RUN_ID}"
    app = create_app({"queue": queue})
    api = client_for(app)
    submit(api, {"items": prompts(3, "Depth"), "priority": 9})
    submit(api, {"items": prompts(2, "Depth low"), "priority": 0})
    text = api.get("/metrics").get_data(as_text=True)
    assert f'eagle3_queue_depth{{queue="{queue}"}} 5.0' in text
    queued = float(re.search(r'eagle3_items\{status="queued"\} (\S+)', text).group(1))
    assert queued >= 5
    down = create_app({"redis_url": "redis://127.0.0.1:1/0"}).test_client().get("/metrics")
    assert down.status_code == 200 and 'eagle3_queue_scrape_ok{source="redis"} 0.0' in down.get_data(as_text=True)


@pytest.fixture(scope="module")
def engine():
    from worker.engine import Engine

    return Engine("tiny", batch_size=8)


def test_worker_metrics_count_a_batch_and_are_served(database, engine):
    app = create_app({"queue": f"metrics-unconsumed-{RUN_ID}"})
    api = client_for(app)
    job = submit(api, {"items": prompts(4, "Metered"), "params": {"max_new_tokens": 4, "measure_baseline": True}})
    Session = session_factory(database)
    with Session() as session:
        ids = session.scalars(select(Item.id).where(Item.job_id == job["id"])).all()
    before = {"items": sample("eagle3_worker_items_processed_total", type="generation", outcome="completed"),
              "batches": sample("eagle3_worker_batch_size_count"),
              "tau": sample("eagle3_worker_accept_length_count"),
              "measured": sample("eagle3_worker_speedup_count", kind="measured"),
              "tokens": sample("eagle3_worker_new_tokens_total")}
    assert processing.process(Session, engine, list(ids), max_attempts=3) == 4
    assert sample("eagle3_worker_items_processed_total", type="generation", outcome="completed") == before["items"] + 4
    assert sample("eagle3_worker_batch_size_count") >= before["batches"] + 1
    assert sample("eagle3_worker_accept_length_count") == before["tau"] + 4
    assert sample("eagle3_worker_speedup_count", kind="measured") >= before["measured"] + 1
    assert sample("eagle3_worker_new_tokens_total") > before["tokens"]
    assert sample("eagle3_worker_last_speedup", kind="measured") > 0

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert metrics.start_server(port, app.extensions["jobs"].celery) == port
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert "eagle3_worker_queue_depth 4.0" in text  # the 4 messages nobody consumed, read at scrape time
    assert 'eagle3_worker_items_processed_total{outcome="completed",type="generation"}' in text
    assert "eagle3_worker_up 1.0" in text and "eagle3_worker_tokens_per_second_bucket" in text


def test_worker_queue_depth_is_nan_while_redis_is_down(database):
    metrics.watch_queue(create_app({"redis_url": "redis://127.0.0.1:1/0"}).extensions["jobs"].celery)
    assert math.isnan(REGISTRY.get_sample_value("eagle3_worker_queue_depth"))


def test_json_logs_carry_the_job_id(client, worker):
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("test.json")
    logger.addHandler(handler)
    try:
        logger.warning("hello %s", "there", extra={"job_id": "j-1"})
    finally:
        logger.removeHandler(handler)
    line = json.loads(stream.getvalue())
    assert line["message"] == "hello there" and line["job_id"] == "j-1" and line["level"] == "WARNING"

    job = submit(client, {"items": prompts(1, "Logged"), "params": {"max_new_tokens": 2}})
    wait_for(client, job["id"])
    lines = [json.loads(raw) for raw in worker.log_path.read_text().splitlines() if raw.startswith("{")]
    assert any(entry.get("job_id") == job["id"] and entry["message"].startswith("decoded") for entry in lines)


def test_alert_rules_cover_backlog_worker_down_and_speedup():
    rules = yaml.safe_load((ROOT / "deploy/prometheus/alerts.yml").read_text())["groups"][0]["rules"]
    exprs = {rule["alert"]: rule["expr"] for rule in rules}
    assert "eagle3_items" in exprs["Eagle3QueueBacklog"]
    assert 'up{job="eagle3-worker"} == 0' in exprs["Eagle3WorkerDown"]
    assert "eagle3_worker_speedup_sum" in exprs["Eagle3SpeedupBelowOne"] and "< 1" in exprs["Eagle3SpeedupBelowOne"]
    exported = {"eagle3_items", "eagle3_queue_depth", "eagle3_worker_up", "eagle3_worker_speedup_sum",
                "eagle3_worker_speedup_count", "eagle3_worker_items_processed_total", "eagle3_api_requests_total"}
    for expr in exprs.values():
        assert set(re.findall(r"eagle3_\w+", expr)) <= exported, expr

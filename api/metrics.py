"""GET /metrics (Prometheus, open like /health; it shows aggregate counts only, nothing about single jobs).

- Request latency by route *template* (`/v1/jobs/<job_id>`, never the raw path: one series per route, not per job)
  and method, and a request counter by route, method and status.
- Queue depth, computed at scrape time: messages waiting in Redis (LLEN of the batch queue's priority lists) and
  items queued/running in Postgres. Every API process reports the same values.

gunicorn runs several worker processes; api/gunicorn.conf.py sets PROMETHEUS_MULTIPROC_DIR so the request metrics
of all of them are aggregated (prometheus_client multiprocess mode). Without it (flask run, tests) the metrics are
those of the one process.
"""
from __future__ import annotations

import os
import time

from flask import Blueprint, Flask, Response, current_app, g, request
from prometheus_client import (CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, Counter, Histogram, generate_latest,
                               multiprocess)
from prometheus_client.core import GaugeMetricFamily
from sqlalchemy import func, select

from jobs.models import Item
from jobs.queue import broker_depth

bp = Blueprint("metrics", __name__)

LATENCY = Histogram("eagle3_api_request_duration_seconds", "API request latency", ["method", "route"],
                    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60))
REQUESTS = Counter("eagle3_api_requests_total", "API requests by response status", ["method", "route", "status"])


def route() -> str:
    return request.url_rule.rule if request.url_rule is not None else "<unmatched>"


def init_app(app: Flask) -> None:
    """Registered first, so the timer starts before authentication and rate limiting."""
    @app.before_request
    def _start():
        g.metrics_start = time.perf_counter()

    @app.after_request
    def _observe(response):
        start = g.pop("metrics_start", None)
        if start is not None:
            rule = route()
            LATENCY.labels(request.method, rule).observe(time.perf_counter() - start)
            REQUESTS.labels(request.method, rule, str(response.status_code)).inc()
        return response


class QueueCollector:
    """Queue depth from Redis and Postgres, read when scraped."""

    def __init__(self, state):
        self.state = state

    def collect(self):
        queue = self.state.settings.queue
        up = GaugeMetricFamily("eagle3_queue_scrape_ok", "1 if the source answered this scrape", labels=["source"])
        depth = GaugeMetricFamily("eagle3_queue_depth", "Messages waiting on the broker (not yet taken by a worker)",
                                  labels=["queue"])
        items = GaugeMetricFamily("eagle3_items", "Items by status in Postgres", labels=["status"])
        try:
            depth.add_metric([queue], broker_depth(self.state.celery))
            up.add_metric(["redis"], 1)
        except Exception:  # noqa: BLE001 - a scrape reports the outage, it does not fail
            up.add_metric(["redis"], 0)
        try:
            with self.state.Session() as session:
                counts = dict(session.execute(select(Item.status, func.count()).where(
                    Item.status.in_(("queued", "running"))).group_by(Item.status)).all())
            for status in ("queued", "running"):
                items.add_metric([status], counts.get(status, 0))
            up.add_metric(["postgres"], 1)
        except Exception:  # noqa: BLE001
            up.add_metric(["postgres"], 0)
        yield from (up, depth, items)


@bp.get("/metrics")
def metrics():
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
    else:
        registry = REGISTRY
    queue_registry = CollectorRegistry()
    queue_registry.register(QueueCollector(current_app.extensions["jobs"]))
    return Response(generate_latest(registry) + generate_latest(queue_registry), mimetype=CONTENT_TYPE_LATEST)

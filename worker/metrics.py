"""Worker metrics (Prometheus), served on WORKER_METRICS_PORT by the process that decodes.

Why there: with the prefork pool the batch runs in the pool child, so its counters live in the child. The worker
runs one child (--concurrency=1, one model per process), so the child starts prometheus_client's HTTP server
itself (worker_process_init) and no multiprocess aggregation is needed. If the port is taken (a second child, or a
second worker on the host) the next free port up to +7 is used and logged. A replaced child (after a crash) starts
a fresh server; its counters restart at 0, which Prometheus' rate() handles as a counter reset.
"""
from __future__ import annotations

import logging

from prometheus_client import Counter, Gauge, Histogram, start_http_server

from jobs.queue import BROKER_ERRORS, broker_depth

log = logging.getLogger(__name__)

ITEMS = Counter("eagle3_worker_items_processed_total", "Items finished by this worker", ["type", "outcome"])
FAILURES = Counter("eagle3_worker_failures_total", "Decode failures", ["kind"])  # kind: item | group | batch
BATCH_SIZE = Histogram("eagle3_worker_batch_size", "Rows decoded together in one generate() call",
                       buckets=(1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64))
BATCH_SECONDS = Histogram("eagle3_worker_batch_seconds", "Wall time of one speculative generate() call",
                          buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800))
TOKENS_PER_S = Histogram("eagle3_worker_tokens_per_second", "New tokens per second of one speculative call",
                         buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000))
TOKENS = Counter("eagle3_worker_new_tokens_total", "New tokens generated (speculative decoding)")
ACCEPT_LENGTH = Histogram("eagle3_worker_accept_length", "tau of one item: tokens emitted per draft/verify round",
                          buckets=(1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 8.0))
SPEEDUP = Histogram("eagle3_worker_speedup", "Speedup over vanilla of one decode group (measured: baseline sample "
                    "decoded both ways; estimated: new tokens / target forwards)", ["kind"],
                    buckets=(0.25, 0.5, 0.75, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0))
LAST_SPEEDUP = Gauge("eagle3_worker_last_speedup", "Speedup of the latest decode group", ["kind"])
UP = Gauge("eagle3_worker_up", "1 while the decoding process serves metrics (its model is loaded)")
QUEUE_DEPTH = Gauge("eagle3_worker_queue_depth", "Decode messages waiting on the broker for this worker's queue, "
                    "read at each scrape (NaN while Redis does not answer)")


def watch_queue(celery) -> None:
    """Report the depth of `celery`'s batch queue at scrape time: a worker's own metrics show the backlog it faces."""
    def depth() -> float:
        try:
            return broker_depth(celery)
        except BROKER_ERRORS:
            return float("nan")
    QUEUE_DEPTH.set_function(depth)


def start_server(port: int, celery=None, tries: int = 8) -> int | None:
    """Serve the default registry on `port` (or the next free one), with the depth of `celery`'s queue if given.
    Returns the port, or None if none was free."""
    if celery is not None:
        watch_queue(celery)
    for candidate in range(port, port + tries):
        try:
            start_http_server(candidate)
        except OSError:
            continue
        UP.set(1)
        log.info("worker metrics on :%d/metrics", candidate, extra={"metrics_port": candidate})
        return candidate
    log.warning("no free port for worker metrics in %d..%d", port, port + tries - 1)
    return None

"""Celery tasks. The batch task pulls up to batch_size item messages at a time (celery-batches) and decodes them
together; the model is loaded when the worker (pool) process starts."""
from __future__ import annotations

import itertools
import logging
import time

import redis
from celery import bootsteps, signals
from celery_batches import Batches, SimpleRequest
from celery_batches.trace import apply_batches_task

from jobs.config import get_settings
from jobs.db import get_engine as get_db_engine
from jobs.db import session_factory
from jobs import files, schedules, streaming
from jobs.adaptation import greedy_items
from jobs.queue import (ADAPT_TASK, BROKER_ERRORS, DECODE_TASK, DISPATCH_TASK, RECONCILE_TASK, REQUEUE_TASK,
                        SWEEP_FILES_TASK, celery_app, enqueue_unsent)
from jobs.reconcile import reconcile as reconcile_items
from jobs.reconcile import running_cutoff_s

from jobs.logs import configure_logging

from . import lease, metrics, processing
from .engine import get_engine

log = logging.getLogger(__name__)
settings = get_settings()
Session = session_factory(settings.database_url)
# A batch that failed as a whole (Postgres unreachable) is handed back with a delay of 5 s, 10 s, 20 s ... 300 s,
# counted per item in the message's `resends` kwarg, so an outage costs a few log lines a minute, not a busy loop.
RESEND_DELAY_S, RESEND_MAX_DELAY_S = 5.0, 300.0
heartbeat: lease.Heartbeat | None = None  # started when the worker is ready
_stream_client = None  # Redis client of the token streams, made on first use (after a prefork child's fork)


def publisher(item, decode) -> streaming.Publisher:
    """Token streaming of one item (jobs/streaming.py)."""
    global _stream_client
    if _stream_client is None:
        _stream_client = redis.Redis.from_url(settings.redis_url, socket_timeout=2.0)
    return streaming.Publisher(_stream_client, streaming.key(settings.queue, item.id), decode,
                               item.params.get("stop"))


@signals.setup_logging.connect  # JSON logs (jobs/logs.py) instead of Celery's own format
def _setup_logging(loglevel=None, **_):
    configure_logging(level=loglevel or None)


@signals.worker_process_init.connect  # prefork: in each child, after the fork
def _load_in_child(**_):
    get_db_engine(settings.database_url).dispose(close=False)  # never share the parent's connections
    get_engine()
    if settings.worker_metrics_port:  # the child decodes, so it serves the metrics (worker/metrics.py)
        metrics.start_server(settings.worker_metrics_port, celery_app)


@signals.worker_init.connect  # solo/threads pools: in the worker process itself (prefork: never in the parent)
def _load_in_worker(sender=None, **_):
    if "prefork" not in str(getattr(sender, "pool_cls", "prefork")):
        get_engine()
        if settings.worker_metrics_port:
            metrics.start_server(settings.worker_metrics_port, celery_app)


@signals.worker_ready.connect  # in the worker's main process (prefork: the parent), once it consumes
def _start_heartbeat(**_):
    global heartbeat
    heartbeat = lease.Heartbeat(Session, celery_app, decode_items.held_items, settings.lease_s)
    heartbeat.start()


@signals.task_received.connect  # a message arrived: lease its item now, not at the next beat
def _lease_now(request=None, **_):
    if heartbeat is not None and getattr(request, "name", None) == DECODE_TASK:
        heartbeat.wake()


class DecodeBatches(Batches):
    """celery-batches' flush, plus what it lacks: when the pool child running a batch dies (SIGKILL, OOM, hard time
    limit), its late-ack messages are requeued at once (task_reject_on_worker_lost). celery-batches passes no error
    callback to the pool, so they would otherwise stay unacked until the visibility timeout.

    It also knows which items this worker holds (held_items), for their leases (worker/lease.py)."""

    abstract = True

    def __init__(self):
        super().__init__()
        # Batches handed to the pool, until their messages are acked or requeued: number -> ids, time, started.
        self._in_flight: dict[int, dict] = {}
        self._batches = itertools.count()

    def held_items(self) -> set[int]:
        """Items whose messages this worker holds: buffered, waiting for their delivery time, or in a batch the pool
        has. A batch handed over longer ago than two hard time limits (one batch ahead of it in the pool, then its
        own) is no longer counted, whatever happened to it, so that no item is held forever."""
        oldest = time.monotonic() - (settings.batch_time_limit + 60) * 2
        held = {item for batch in list(self._in_flight.values()) if batch["at"] > oldest for item in batch["ids"]}
        for queue in (self._buffer, self._pending):
            with queue.mutex:
                held.update(request.args[0] for request in queue.queue)
        return held

    def forget_unstarted(self) -> None:
        """After a lost broker connection, Celery drops the batches no pool child has started (their messages cannot
        be acked on a new connection) and clears the event loop's timers, celery-batches' flush timer included:
        stop holding those batches, and let the next message start a new flush timer."""
        for number, batch in list(self._in_flight.items()):
            if not batch["started"]:
                self._in_flight.pop(number, None)
        self._tref = None

    def flush(self, requests):
        early = [r for r in requests if not r.task.acks_late]
        late = [r for r in requests if r.task.acks_late]
        number = next(self._batches)
        batch = self._in_flight[number] = {"ids": [r.args[0] for r in requests], "at": time.monotonic(),
                                           "started": False}

        def on_accepted(pid, time_accepted):
            batch["started"] = True
            for request in early:
                request.acknowledge()

        def on_return(result):
            self._in_flight.pop(number, None)
            for request in late:
                request.acknowledge()

        def on_lost(exc_info):
            self._in_flight.pop(number, None)
            for request in late:
                request.reject(requeue=bool(self.app.conf.task_reject_on_worker_lost))

        simple = ([SimpleRequest.from_request(r) for r in requests],)
        return self._pool.apply_async(apply_batches_task, (self, simple, 0, None), accept_callback=on_accepted,
                                      callback=on_return, error_callback=on_lost)


@celery_app.task(base=DecodeBatches, name=DECODE_TASK, flush_every=settings.batch_size,
                 flush_interval=settings.flush_interval, acks_late=True,
                 soft_time_limit=settings.batch_time_limit, time_limit=settings.batch_time_limit + 60)
def decode_items(requests):
    """requests: celery-batches SimpleRequests, each with args=[item_id] (and kwargs={"resends": n} once handed
    back)."""
    item_ids = [request.args[0] for request in requests]
    try:
        written = processing.process(Session, get_engine(), item_ids, settings.max_attempts,
                                     db_retry_s=settings.db_retry_s, owner=lease.OWNER, lease_s=settings.lease_s,
                                     publisher=publisher)
    except Exception:
        # celery-batches acks the messages even when this raises; put the items back on the queue (claiming caps
        # the attempts) and re-raise so the failure is logged.
        metrics.FAILURES.labels("batch").inc()
        delay = hand_back(requests)
        log.exception("batch of %d items failed; re-sent them with a delay of %.0f s", len(item_ids), delay,
                      extra={"items": item_ids})
        raise
    log.info("batch of %d messages: %d results written", len(item_ids), written)


def hand_back(requests) -> float:
    """Re-send each request's item with a delay that doubles with every hand-back. If Redis is down too, the items
    stay queued/running in Postgres and the reconciler re-sends them later. Returns the longest delay used."""
    longest = 0.0
    for request in requests:
        resends = int((request.kwargs or {}).get("resends", 0))
        delay = min(RESEND_DELAY_S * 2 ** resends, RESEND_MAX_DELAY_S)
        longest = max(longest, delay)
        priority = (request.delivery_info or {}).get("priority")
        try:
            celery_app.send_task(DECODE_TASK, args=[request.args[0]], kwargs={"resends": resends + 1},
                                 queue=settings.queue, countdown=delay, priority=priority)
        except BROKER_ERRORS:
            log.warning("broker unavailable: %d items stay in Postgres for the reconciler", len(requests))
            break
    return longest


class ForgetUnstartedBatches(bootsteps.StartStopStep):
    """Called when the consumer stops: at shutdown, and when the broker connection is lost and re-established."""

    requires = {"celery.worker.consumer.tasks:Tasks"}

    def stop(self, consumer):
        decode_items.forget_unstarted()


celery_app.steps["consumer"].add(ForgetUnstartedBatches)


@celery_app.task(name=REQUEUE_TASK, acks_late=False)
def requeue_unsent():
    """Beat, every minute: send items that never reached the broker (their submission met a Redis outage)."""
    try:
        with Session.begin() as session:
            sent = enqueue_unsent(session, celery_app, min_age_s=30)
    except BROKER_ERRORS:
        log.warning("broker unavailable; unsent items stay queued in Postgres")
        return 0
    if sent:
        log.info("re-sent %d items that had not reached the broker", sent)
    return sent


@celery_app.task(name=DISPATCH_TASK, acks_late=False)
def dispatch_schedules():
    """Beat, every minute: create the jobs of the schedules that are due (once per due time; jobs/schedules.py)."""
    runs = schedules.dispatch(Session, celery_app, settings)
    return [{"schedule_id": str(r.schedule_id), "due_at": r.due_at.isoformat(),
             "job_id": str(r.job_id) if r.job_id else None, "error": r.error} for r in runs]


@celery_app.task(name=RECONCILE_TASK, acks_late=False)
def reconcile():
    """Beat, every RECONCILE_INTERVAL_S: re-send items that are queued in Postgres but that Redis no longer holds
    (it restarted without persistence), and items a lost worker left running (jobs/reconcile.py)."""
    try:
        report = reconcile_items(Session, celery_app, after_s=settings.reconcile_after_s,
                                 running_after_s=running_cutoff_s(settings.batch_time_limit,
                                                                  settings.reconcile_after_s))
    except BROKER_ERRORS:
        log.warning("reconciler: broker unavailable; trying again at the next run")
        return 0
    return report.resent


@celery_app.task(name=ADAPT_TASK, acks_late=False)
def adapt_head(last: int | None = None, job_ids: list[str] | None = None, steps: int | None = None,
               lr: float | None = None) -> dict:
    """Beat, on ADAPT_SCHEDULE (or sent by hand): fine-tune the draft head on the deployment's recent greedy items
    and install it if held-out τ rose (eagle3/adapt.py). Decoding workers pick the new version up at their next
    batch. Runs on `<queue>.adapt`, with the target this worker process already loaded."""
    from dataclasses import asdict

    from eagle3.adapt import Example, adapt

    engine = get_engine()
    with Session() as session:
        rows = greedy_items(session, engine.chat, job_ids or (), last or settings.adapt_last)
    if len(rows) < 2:
        log.info("adapt_head: %d completed greedy items, nothing to adapt to", len(rows))
        return {"installed": False, "items": len(rows)}
    report = adapt(engine.target, [Example(*row) for row in rows], steps=steps or settings.adapt_steps or None,
                   lr=lr or settings.adapt_lr, log=log.info)
    log.info("adapt_head: held-out tau %.3f (version %d) -> %.3f: %s", report.tau_current, report.parent,
             report.tau_candidate, f"installed version {report.version}" if report.installed else "refused")
    engine.refresh_head()  # this worker decodes on it from its next batch too
    return asdict(report)


@celery_app.task(name=SWEEP_FILES_TASK, acks_late=False)
def sweep_files():
    """Beat, every FILES_SWEEP_INTERVAL_S: delete the files past their retention that no running batch reads, and
    FILES_DIR's leftovers of failed uploads (jobs/files.py)."""
    with Session() as session:
        deleted = files.sweep(session, settings)
    if deleted:
        log.info("deleted %d expired files", deleted)
    return deleted

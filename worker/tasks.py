"""Celery tasks. The batch task pulls up to batch_size item messages at a time (celery-batches) and decodes them
together; the model is loaded when the worker (pool) process starts."""
from __future__ import annotations

import logging

from celery import signals
from celery_batches import Batches, SimpleRequest
from celery_batches.trace import apply_batches_task

from jobs.config import get_settings
from jobs.db import get_engine as get_db_engine
from jobs.db import session_factory
from jobs import schedules
from jobs.queue import (BROKER_ERRORS, DECODE_TASK, DISPATCH_TASK, RECONCILE_TASK, REQUEUE_TASK, celery_app,
                        enqueue_unsent)
from jobs.reconcile import reconcile as reconcile_items
from jobs.reconcile import running_cutoff_s

from jobs.logs import configure_logging

from . import metrics, processing
from .engine import get_engine

log = logging.getLogger(__name__)
settings = get_settings()
Session = session_factory(settings.database_url)
# A batch that failed as a whole (Postgres unreachable) is handed back with a delay of 5 s, 10 s, 20 s ... 300 s,
# counted per item in the message's `resends` kwarg, so an outage costs a few log lines a minute, not a busy loop.
RESEND_DELAY_S, RESEND_MAX_DELAY_S = 5.0, 300.0


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


class DecodeBatches(Batches):
    """celery-batches' flush, plus what it lacks: when the pool child running a batch dies (SIGKILL, OOM, hard time
    limit), its late-ack messages are requeued at once (task_reject_on_worker_lost). celery-batches passes no error
    callback to the pool, so they would otherwise stay unacked until the visibility timeout."""

    abstract = True

    def flush(self, requests):
        early = [r for r in requests if not r.task.acks_late]
        late = [r for r in requests if r.task.acks_late]

        def on_accepted(pid, time_accepted):
            for request in early:
                request.acknowledge()

        def on_return(result):
            for request in late:
                request.acknowledge()

        def on_lost(exc_info):
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
                                     db_retry_s=settings.db_retry_s)
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

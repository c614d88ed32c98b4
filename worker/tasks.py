"""Celery tasks. The batch task pulls up to batch_size item messages at a time (celery-batches) and decodes them
together; the model is loaded when the worker (pool) process starts."""
from __future__ import annotations

import logging

from celery import signals
from celery_batches import Batches

from jobs.config import get_settings
from jobs.db import get_engine as get_db_engine
from jobs.db import session_factory
from jobs.queue import BROKER_ERRORS, DECODE_TASK, REQUEUE_TASK, celery_app, enqueue_unsent

from . import processing
from .engine import get_engine

log = logging.getLogger(__name__)
settings = get_settings()
Session = session_factory(settings.database_url)


@signals.worker_process_init.connect  # prefork: in each child, after the fork
def _load_in_child(**_):
    get_db_engine(settings.database_url).dispose(close=False)  # never share the parent's connections
    get_engine()


@signals.worker_init.connect  # solo/threads pools: in the worker process itself (prefork: never in the parent)
def _load_in_worker(sender=None, **_):
    if "prefork" not in str(getattr(sender, "pool_cls", "prefork")):
        get_engine()


@celery_app.task(base=Batches, name=DECODE_TASK, flush_every=settings.batch_size,
                 flush_interval=settings.flush_interval, acks_late=True, reject_on_worker_lost=True,
                 soft_time_limit=settings.batch_time_limit, time_limit=settings.batch_time_limit + 60)
def decode_items(requests):
    """requests: celery-batches SimpleRequests, each with args=[item_id]."""
    item_ids = [request.args[0] for request in requests]
    try:
        written = processing.process(Session, get_engine(), item_ids, settings.max_attempts)
    except Exception:
        # celery-batches acks the messages even when this raises; put the items back on the queue (claiming caps
        # the attempts) and re-raise so the failure is logged.
        log.exception("batch of %d items failed; re-sending them in 5 s", len(item_ids))
        for item_id in item_ids:
            celery_app.send_task(DECODE_TASK, args=[item_id], queue=settings.queue, countdown=5)
        raise
    log.info("batch of %d messages: %d results written", len(item_ids), written)


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

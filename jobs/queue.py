"""The Celery app (Redis broker) and how items are put on the queue.

The API only *sends* messages (by task name, it never imports worker code); worker/ registers the tasks on this
same app. A message carries an item id and nothing else: everything else is read from Postgres.
"""
from __future__ import annotations

import base64
import json
from datetime import timedelta

import kombu.exceptions
import redis.exceptions
from celery import Celery
from celery.schedules import crontab
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from .config import Settings, get_settings
from .db import id_in
from .models import Item, Job

DECODE_TASK = "worker.decode_items"
REQUEUE_TASK = "worker.requeue_unsent"
DISPATCH_TASK = "worker.dispatch_schedules"
RECONCILE_TASK = "worker.reconcile"
ADAPT_TASK = "worker.adapt_head"
SWEEP_FILES_TASK = "worker.sweep_files"
MAX_PRIORITY = 9  # API priority 0..9, 9 most urgent


def make_celery(settings: Settings) -> Celery:
    app = Celery("eagle3_jobs", broker=settings.redis_url, set_as_current=False)
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        task_ignore_result=True,  # results go to Postgres; there is no result backend
        task_default_queue=settings.queue,
        task_routes={DECODE_TASK: {"queue": settings.queue}, REQUEUE_TASK: {"queue": settings.queue + ".maint"},
                     DISPATCH_TASK: {"queue": settings.queue + ".maint"},
                     RECONCILE_TASK: {"queue": settings.queue + ".maint"},
                     # Its own queue: a fine-tune takes minutes and must not hold up .maint's every-minute tasks.
                     ADAPT_TASK: {"queue": settings.queue + ".adapt"},
                     SWEEP_FILES_TASK: {"queue": settings.queue + ".maint"}},
        # Redeliver the messages of a batch whose worker died; writes are idempotent (see worker/processing.py).
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        # celery-batches buffers unacked messages until flush_every of them arrived: prefetch must exceed it.
        worker_prefetch_multiplier=2 * settings.batch_size,
        worker_concurrency=1,  # one model per worker process; scale with more workers (one per GPU)
        # A pool child loads the model before it reports up; Celery's default (4 s) would kill it mid-load.
        worker_proc_alive_timeout=600,
        broker_connection_retry_on_startup=True,
        broker_transport_options={
            "visibility_timeout": settings.visibility_timeout,
            # Redis emulates priorities with one list per step; it serves the *lowest* number first.
            "priority_steps": list(range(MAX_PRIORITY + 1)),
            "queue_order_strategy": "priority",
        },
        worker_send_task_events=False,
        # Fail a publish fast when Redis is down (the API answers 503; the items stay unsent in Postgres).
        task_publish_retry_policy={"max_retries": 2, "interval_start": 0, "interval_step": 0.2, "interval_max": 0.5},
        broker_connection_timeout=2,
        # Run exactly one beat (`celery -A worker beat`). A second one is still harmless: requeueing is idempotent,
        # and the dispatcher creates each schedule's run once per due time (jobs/schedules.py). Each message expires
        # after a minute, so a backlog of them (no maint worker for a while) does not pile up.
        beat_schedule={
            "requeue-unsent": {"task": REQUEUE_TASK, "schedule": 60.0, "options": {"expires": 60}},
            "dispatch-schedules": {"task": DISPATCH_TASK, "schedule": 60.0, "options": {"expires": 60}},
        },
    )
    # Re-send items whose messages Redis lost (jobs/reconcile.py).
    app.conf.beat_schedule["reconcile"] = {"task": RECONCILE_TASK, "schedule": settings.reconcile_interval_s}
    if settings.adapt_schedule:  # workload adaptation of the draft head (eagle3/adapt.py), off by default
        app.conf.beat_schedule["adapt-head"] = {"task": ADAPT_TASK, "schedule": adapt_crontab(settings.adapt_schedule)}
    # Delete /v1/files past their retention (jobs/files.py).
    app.conf.beat_schedule["sweep-files"] = {"task": SWEEP_FILES_TASK, "schedule": settings.files_sweep_interval_s,
                                             "options": {"expires": settings.files_sweep_interval_s}}
    return app


def adapt_crontab(expression: str) -> crontab:
    """A 5-field cron expression (minute hour day-of-month month day-of-week) as Celery's crontab, in UTC."""
    fields = expression.split()
    if len(fields) != 5:
        raise ValueError(f"ADAPT_SCHEDULE must have 5 cron fields, got {expression!r}")
    minute, hour, day_of_month, month_of_year, day_of_week = fields
    return crontab(minute=minute, hour=hour, day_of_month=day_of_month, month_of_year=month_of_year,
                   day_of_week=day_of_week)


celery_app = make_celery(get_settings())

# What a publish raises when the broker cannot be reached.
BROKER_ERRORS = (kombu.exceptions.OperationalError, redis.exceptions.RedisError, OSError)


def enqueue_unsent(session: Session, celery: Celery, job_id=None, min_age_s: float | None = None) -> int:
    """Send a message for each queued item that has none yet (enqueued_at IS NULL) and mark it sent.

    Called right after a job is committed, on an idempotent replay of the same submission, and periodically by beat
    (for jobs whose submission met a broker outage). Sending twice is harmless: the worker claims an item once.
    Raises kombu/redis errors when the broker is down; unsent items then stay NULL. The caller commits.
    """
    query = select(Item.id, Job.priority).join(Job).where(Item.status == "queued", Item.enqueued_at.is_(None))
    if job_id is not None:
        query = query.where(Item.job_id == job_id)
    if min_age_s is not None:
        query = query.where(Job.created_at < func.now() - timedelta(seconds=min_age_s))
    rows = session.execute(query.order_by(Item.id)).all()
    if not rows:
        return 0
    send_items(celery, rows)
    session.execute(update(Item).where(id_in(Item.id, [r.id for r in rows])).values(enqueued_at=func.now()))
    return len(rows)


def send_items(celery: Celery, rows) -> None:
    """One "decode item N" message per (item_id, job priority) pair, on the batch queue."""
    queue = celery.conf.task_default_queue
    with celery.producer_or_acquire() as producer:
        for item_id, priority in rows:
            celery.send_task(DECODE_TASK, args=[item_id], queue=queue, producer=producer,
                             priority=MAX_PRIORITY - priority)  # Redis serves low numbers first


def _item_of(message: dict) -> int | None:
    """The item id a raw kombu message (as Redis stores it) carries, if it is a decode message."""
    try:
        if message.get("headers", {}).get("task") != DECODE_TASK:
            return None
        body = message["body"]
        if message.get("properties", {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        args = json.loads(body)[0]
        return int(args[0])
    except (KeyError, IndexError, TypeError, ValueError):
        return None


def _priority_lists(channel, queue: str) -> list[str]:
    """The Redis lists kombu keeps for `queue`, one per priority step (the same name for steps that share one)."""
    return sorted({channel._q_for_pri(queue, step) for step in channel.priority_steps})


def items_in_broker(celery: Celery) -> set[int]:
    """The item ids that Redis holds decode messages for on the batch queue: waiting in one of its priority lists, or
    delivered to a worker and not yet acked (kombu's `unacked` hash, which also holds what workers have prefetched
    and the delayed re-sends they hold). One MULTI/EXEC, so the lists and the hash are read at the same instant.

    Reads kombu's Redis layout (list per priority step, `unacked` hash of [message, exchange, routing_key]); cost is
    linear in the messages held, which a beat task once a minute can afford."""
    queue = celery.conf.task_default_queue
    with celery.connection_for_read() as connection:
        channel = connection.default_channel
        if not hasattr(channel, "unacked_key"):
            raise NotImplementedError(f"items_in_broker reads Redis only, not {connection.transport_cls}")
        pipe = channel.client.pipeline(transaction=True)
        for name in _priority_lists(channel, queue):
            pipe.lrange(name, 0, -1)
        pipe.hvals(channel.unacked_key)
        *waiting, unacked = pipe.execute()
    messages = [json.loads(raw) for chunk in waiting for raw in chunk]
    for raw in unacked:
        message, _exchange, routing_key = json.loads(raw)
        if routing_key == queue:
            messages.append(message)
    return {item for item in map(_item_of, messages) if item is not None}


def broker_depth(celery: Celery) -> int:
    """Decode messages waiting on the batch queue (all its priority lists; not those a worker already holds)."""
    queue = celery.conf.task_default_queue
    with celery.connection_for_read() as connection:
        channel = connection.default_channel
        pipe = channel.client.pipeline()
        for name in _priority_lists(channel, queue):
            pipe.llen(name)
        return sum(pipe.execute())


def purge_redis(redis_url: str, marker: str) -> None:
    """Delete the queues and kombu bindings of a throwaway run: every Redis key and binding member naming `marker`
    (tests and the load test name their queues after a run id)."""
    import redis

    client = redis.Redis.from_url(redis_url)
    keys = list(client.scan_iter(match=f"*{marker}*"))
    if keys:
        client.delete(*keys)
    for binding in client.scan_iter(match="_kombu.binding*"):
        if client.type(binding) == b"set":
            for member in client.smembers(binding):
                if marker.encode() in member:
                    client.srem(binding, member)
    client.close()

"""The Celery app (Redis broker) and how items are put on the queue.

The API only *sends* messages (by task name, it never imports worker code); worker/ registers the tasks on this
same app. A message carries an item id and nothing else: everything else is read from Postgres.
"""
from __future__ import annotations

from datetime import timedelta

import kombu.exceptions
import redis.exceptions
from celery import Celery
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from .config import Settings, get_settings
from .db import id_in
from .models import Item, Job

DECODE_TASK = "worker.decode_items"
REQUEUE_TASK = "worker.requeue_unsent"
DISPATCH_TASK = "worker.dispatch_schedules"
MAX_PRIORITY = 9  # API priority 0..9, 9 most urgent


def make_celery(settings: Settings) -> Celery:
    app = Celery("eagle3_jobs", broker=settings.redis_url, set_as_current=False)
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        task_ignore_result=True,  # results go to Postgres; there is no result backend
        task_default_queue=settings.queue,
        task_routes={DECODE_TASK: {"queue": settings.queue}, REQUEUE_TASK: {"queue": settings.queue + ".maint"},
                     DISPATCH_TASK: {"queue": settings.queue + ".maint"}},
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
    return app


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
    queue = celery.conf.task_default_queue
    with celery.producer_or_acquire() as producer:
        for item_id, priority in rows:
            celery.send_task(DECODE_TASK, args=[item_id], queue=queue, producer=producer,
                             priority=MAX_PRIORITY - priority)  # Redis serves low numbers first
    session.execute(update(Item).where(id_in(Item.id, [r.id for r in rows])).values(enqueued_at=func.now()))
    return len(rows)

"""The reconciler: find items that Postgres says are waiting for a worker but that no live worker holds and whose
message the broker may no longer hold, and send them again.

Two parts:
- `requeue_expired`: items whose lease expired. The worker that held them (prefetched, or decoding them) stopped
  renewing it: it is dead, or stopped. They go back to `queued` and are re-sent, whatever Redis holds: a dead worker's
  messages sit in Redis' unacked hash until the visibility timeout (2 hours by default), which is only the last
  resort. Cheap (one indexed query), so every worker runs it from its heartbeat thread (worker/lease.py).
- `reconcile`: also the items Redis lost, below. Beat runs it every RECONCILE_INTERVAL_S (worker.tasks.reconcile);
  tests call it directly.

Why it is needed: the broker is not the source of truth. Redis without persistence forgets every waiting and
delivered-unacked message when it restarts, and a re-send can fail when Redis is down at that moment. Postgres still
knows each such item is `queued` (or `running`, for a worker that died while Redis was gone).

What counts as lost (both conditions, so a healthy backlog is never sent twice):
- In Postgres: not leased, and `queued` and last sent more than `after_s` ago; or `running` (claimed before leases
  existed) and claimed longer ago than a batch may run (hard time limit) plus `after_s`, so no live worker can still
  be decoding it.
- In Redis: no decode message for it, neither waiting nor delivered-unacked (jobs.queue.items_in_broker). Checked
  twice, `confirm_s` apart, because a worker takes a message off the list an instant before it records it as
  unacked.

Re-sending is safe: claiming skips finished items and a result is written once per item (jobs/lifecycle.py). An
item re-sent while a message for it was in fact still on its way is at worst claimed twice (one more attempt,
ITEM_MAX_ATTEMPTS still caps it), never given two results. A `running` item sent again gets one more delivery and
is failed by claim() if that exceeds ITEM_MAX_ATTEMPTS.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import timedelta

from celery import Celery
from sqlalchemy import func, or_, select, update
from sqlalchemy.orm import Session

from .db import id_in
from .models import Item, Job
from .queue import items_in_broker, send_items

log = logging.getLogger(__name__)


@dataclass
class Reconciled:
    queued: int = 0  # queued items re-sent
    running: int = 0  # items left running by a lost worker, put back to queued and re-sent
    in_broker: int = 0  # decode messages Redis holds (first look)
    expired: int = 0  # items whose lease expired, re-sent

    @property
    def resent(self) -> int:
        return self.queued + self.running + self.expired


def _stale(after_s: float, running_after_s: float):
    now = func.now()
    return Item.lease_expires_at.is_(None) & or_(
        (Item.status == "queued") & Item.enqueued_at.is_not(None) & (Item.enqueued_at < now - timedelta(seconds=after_s)),
        (Item.status == "running") & (Item.started_at < now - timedelta(seconds=running_after_s)))


def requeue_expired(Session, celery: Celery, limit: int = 10_000) -> int:
    """Put the unfinished items whose lease expired back to `queued`, unleased, and send them again. Returns how many.
    Rows another reconciler has locked are skipped (it is re-sending them). Raises broker errors when Redis is down
    (then nothing was changed)."""
    with Session.begin() as session:
        rows = session.execute(select(Item.id, Job.priority).join(Job)
                               .where(Item.status.in_(("queued", "running")), Item.lease_expires_at < func.now())
                               .order_by(Item.id).limit(limit).with_for_update(of=Item, skip_locked=True)).all()
        if not rows:
            return 0
        send_items(celery, rows)  # raises before anything is committed
        session.execute(update(Item).where(id_in(Item.id, [r.id for r in rows]))
                        .values(status="queued", enqueued_at=func.now(), lease_owner=None, lease_expires_at=None))
    log.warning("reconciler: re-sent %d items whose worker's lease expired", len(rows),
                extra={"items": [r.id for r in rows][:100]})
    return len(rows)


def reconcile(Session, celery: Celery, *, after_s: float, running_after_s: float, confirm_s: float = 1.0,
              limit: int = 50_000) -> Reconciled:
    """Re-send the items the broker lost (see the module docstring). `Session`: a sessionmaker; each step commits
    on its own so no transaction stays open while Redis is read. Raises broker errors when Redis is down (then
    nothing was changed)."""
    report = Reconciled(expired=requeue_expired(Session, celery))
    with Session() as session:
        candidates = set(session.scalars(select(Item.id).where(_stale(after_s, running_after_s))
                                         .order_by(Item.id).limit(limit)).all())
    if not candidates:
        return report
    seen = items_in_broker(celery)
    report.in_broker = len(seen)
    missing = candidates - seen
    if missing and confirm_s > 0:
        time.sleep(confirm_s)
        missing -= items_in_broker(celery)
    if not missing:
        return report
    with Session.begin() as session:
        # Lock and re-check: an item claimed or finished meanwhile is no longer stale and drops out here.
        rows = session.execute(select(Item.id, Item.status, Job.priority).join(Job)
                               .where(id_in(Item.id, missing), _stale(after_s, running_after_s))
                               .order_by(Item.id).with_for_update(of=Item)).all()
        if not rows:
            return report
        send_items(celery, [(r.id, r.priority) for r in rows])  # raises before anything is committed
        session.execute(update(Item).where(id_in(Item.id, [r.id for r in rows]))
                        .values(status="queued", enqueued_at=func.now()))
    report.queued = sum(r.status == "queued" for r in rows)
    report.running = len(rows) - report.queued
    log.warning("reconciler: re-sent %d queued and %d abandoned running items that the broker no longer held",
                report.queued, report.running)
    return report


def running_cutoff_s(batch_time_limit: float, after_s: float) -> float:
    """How long an item may stay `running` before no live worker can still be on it: the batch's hard time limit
    (soft limit + 60 s, worker/tasks.py) plus the reconciler's own margin."""
    return batch_time_limit + 60 + after_s

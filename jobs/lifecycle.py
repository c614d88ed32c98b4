"""Job and item state transitions. Each function runs inside the caller's transaction and first locks the job rows
it touches (in id order, so concurrent workers and cancels serialize per job and never deadlock)."""
from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from sqlalchemy import func, insert, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.orm import Session

from .db import id_in
from .models import Item, ItemResult, Job

log = logging.getLogger(__name__)
JOB_FINAL = ("completed", "failed", "cancelled")


@dataclass
class Outcome:
    """What a worker produced for one item: output or error, plus the decoder stats."""
    item_id: int
    output: dict | None = None
    error: str | None = None
    stats: dict | None = None
    baseline_stats: dict | None = None


def _now() -> datetime:
    return datetime.now(timezone.utc)


class Conflict(Exception):
    """The job is in a state that does not allow the operation."""


def lock_jobs(session: Session, job_ids) -> dict[uuid.UUID, Job]:
    jobs = session.scalars(select(Job).where(Job.id.in_(sorted(set(job_ids)))).order_by(Job.id)
                           .with_for_update().execution_options(populate_existing=True)).all()
    return {job.id: job for job in jobs}


@dataclass(frozen=True)
class Claimed:
    """An item a worker now owns, detached from the session (decoding runs outside any transaction)."""
    id: int
    job_type: str
    prompt: str
    params: dict
    baseline_sample: bool
    job_id: uuid.UUID | None = None
    messages: list[dict] | None = None  # chat turns instead of `prompt`
    options: dict | None = None  # the job's kind-specific fields (jobs/kinds.py)


def _lease_free(owner: str | None):
    """The item's lease is `owner`'s, expired, or nobody's."""
    return (Item.lease_owner.is_(None) | (Item.lease_owner == owner) | (Item.lease_expires_at < func.now()))


def _lease_until(lease_s: float):
    return func.now() + timedelta(seconds=lease_s)


def claim(session: Session, item_ids: list[int], max_attempts: int, owner: str | None = None,
          lease_s: float = 60.0) -> tuple[list[Claimed], list[Outcome]]:
    """Mark the deliverable items running (one more attempt each), leased to `owner` for `lease_s` (no lease without
    an owner), and return them.

    Items already finished or cancelled are skipped: that is what makes redelivery and duplicate messages harmless.
    So is a running item whose lease another worker still holds: it is decoding it. An item delivered max_attempts
    times already (its batch keeps killing the worker) is failed instead.
    """
    job_ids = session.scalars(select(Item.job_id).where(id_in(Item.id, item_ids)).distinct()).all()
    jobs = lock_jobs(session, job_ids)
    live = id_in(Item.id, item_ids) & ((Item.status == "queued") | ((Item.status == "running") & _lease_free(owner)))
    exhausted = session.scalars(select(Item.id).where(live, Item.attempts >= max_attempts)).all()  # before claiming
    rows = session.execute(
        update(Item).where(live, Item.attempts < max_attempts)
        .values(status="running", attempts=Item.attempts + 1, started_at=func.now(), lease_owner=owner,
                lease_expires_at=_lease_until(lease_s) if owner is not None else None)
        .returning(Item.id, Item.job_id, Item.prompt, Item.params, Item.baseline_sample, Item.messages)).all()
    for job_id in {row.job_id for row in rows}:
        job = jobs[job_id]
        if job.status == "queued":
            job.status, job.started_at = "running", _now()
    claimed = [Claimed(r.id, jobs[r.job_id].type, r.prompt, r.params, r.baseline_sample, r.job_id, r.messages,
                       jobs[r.job_id].options)
               for r in sorted(rows, key=lambda r: r.id)]
    gave_up = [Outcome(item_id, error=f"gave up after {max_attempts} deliveries (the worker was lost each time)")
               for item_id in exhausted]
    return claimed, gave_up


def earlier_outputs(session: Session, job_ids, limit: int = 64) -> dict[uuid.UUID, list[list[int]]]:
    """Token ids of each job's most recent completed outputs (at most `limit` per job, newest first): text a bulk
    job's next items often repeat, which the suffix and hybrid drafters draft from (eagle3 `references`)."""
    out = {}
    for job_id in job_ids:
        rows = session.execute(
            select(ItemResult.output).join(Item).where(Item.job_id == job_id, ItemResult.output.is_not(None))
            .order_by(ItemResult.created_at.desc()).limit(limit)).scalars()
        out[job_id] = [o["token_ids"] for o in rows if isinstance(o, dict) and o.get("token_ids")]
    return out


def renew(session: Session, item_ids: list[int], owner: str, lease_s: float) -> int:
    """Lease (or lease again) the unfinished items `owner` holds, unless another worker's lease on one is still
    live. Returns the items leased."""
    return len(session.scalars(
        update(Item).where(id_in(Item.id, item_ids), Item.status.in_(("queued", "running")), _lease_free(owner))
        .values(lease_owner=owner, lease_expires_at=_lease_until(lease_s)).returning(Item.id)).all())


def record(session: Session, outcomes: list[Outcome], owner: str | None = None) -> int:
    """Write each item's result once, count it into its job and move the job on. Returns the results written.

    `owner`: a worker's results. Only items still running under its lease are written (checked under the items'
    row locks, in this transaction); a worker that lost its lease (it was stopped past it, and the item was re-sent
    and claimed by another) has its results discarded, so an item never gets a second decode's result."""
    if not outcomes:
        return 0
    by_id = {outcome.item_id: outcome for outcome in outcomes}
    job_of = dict(session.execute(select(Item.id, Item.job_id).where(id_in(Item.id, by_id))).all())
    jobs = lock_jobs(session, job_of.values())
    if owner is not None:
        mine = set(session.scalars(select(Item.id).where(id_in(Item.id, job_of), Item.status == "running",
                                                         Item.lease_owner == owner)
                                   .order_by(Item.id).with_for_update()).all())
        if len(mine) < len(job_of):
            log.warning("discarded %d results: their items' leases are no longer this worker's (%s)",
                        len(job_of) - len(mine), owner, extra={"items": sorted(set(job_of) - mine)})
        job_of = {item_id: job_id for item_id, job_id in job_of.items() if item_id in mine}
    rows = [{"item_id": o.item_id, "output": o.output, "error": o.error, "stats": o.stats,
             "baseline_stats": o.baseline_stats} for o in by_id.values() if o.item_id in job_of]
    if not rows:  # the items no longer exist
        return 0
    written = session.scalars(pg_insert(ItemResult).values(rows).on_conflict_do_nothing()
                              .returning(ItemResult.item_id)).all()
    for item_id in written:
        outcome, job = by_id[item_id], jobs[job_of[item_id]]
        _count(job, outcome)
    failed = [i for i in written if by_id[i].error is not None]
    done = [i for i in written if by_id[i].error is None]
    for status, ids in (("completed", done), ("failed", failed)):
        if ids:
            session.execute(update(Item).where(id_in(Item.id, ids))
                            .values(status=status, finished_at=func.now(), lease_owner=None, lease_expires_at=None))
    for job in jobs.values():
        _finish_if_done(job)
    return len(written)


def _count(job: Job, outcome: Outcome) -> None:
    if outcome.error is not None:
        job.failed_items += 1
        return
    job.completed_items += 1
    stats = outcome.stats or {}
    job.new_tokens += stats.get("new_tokens", 0)
    job.target_forwards += stats.get("target_forwards", 0)
    job.rounds += stats.get("rounds", 0)
    job.accepted_tokens += round(stats.get("accept_length", 0.0) * stats.get("rounds", 0))
    job.decode_time_s += stats.get("time_share_s", 0.0)
    if outcome.baseline_stats:
        job.sample_items += 1
        job.sample_new_tokens += stats.get("new_tokens", 0)
        job.sample_decode_time_s += stats.get("time_share_s", 0.0)
        job.baseline_new_tokens += outcome.baseline_stats.get("new_tokens", 0)
        job.baseline_decode_time_s += outcome.baseline_stats.get("time_share_s", 0.0)


def _finish_if_done(job: Job) -> None:
    if job.status in JOB_FINAL:
        return
    if job.completed_items + job.failed_items + job.cancelled_items < job.total_items:
        return
    if job.cancel_requested_at is not None:
        job.status = "cancelled"
    else:
        job.status = "failed" if job.completed_items == 0 else "completed"
    job.finished_at = _now()


def cancel(session: Session, job_id: uuid.UUID) -> Job | None:
    """Cancel a job: its queued items will not run (they get a 'cancelled' result now); running items finish and
    keep their results; the job ends 'cancelled' once none is running. Returns None for an unknown job."""
    job = lock_jobs(session, [job_id]).get(job_id)
    if job is None:
        return None
    if job.status in ("completed", "failed"):
        raise Conflict(f"job is already {job.status}")
    if job.status in ("cancelling", "cancelled"):
        return job
    cancelled = session.scalars(update(Item).where(Item.job_id == job_id, Item.status == "queued")
                                .values(status="cancelled", finished_at=func.now(), lease_owner=None,
                                        lease_expires_at=None).returning(Item.id)).all()
    if cancelled:
        session.execute(insert(ItemResult), [{"item_id": i, "error": "cancelled before it ran"} for i in cancelled])
    job.cancelled_items += len(cancelled)
    job.cancel_requested_at = _now()
    job.status = "cancelling"
    _finish_if_done(job)
    return job

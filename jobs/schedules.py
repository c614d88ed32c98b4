"""Scheduled jobs: validating a schedule, and the dispatcher that beat runs every minute.

Exactly once per due time, even with two beats (or two dispatcher runs at once):
- each schedule is handled in its own transaction that locks its row (FOR UPDATE SKIP LOCKED: a second dispatcher
  skips a schedule the first is handling), and
- the run is a row with a unique (schedule_id, due_at): whoever inserts it first creates the job, in the same
  transaction; anyone else's insert does nothing.

Catch-up: after downtime only the *latest* missed due time runs (one job, not one per missed night), so a
dispatcher that was down for a week does not flood the queue. Older missed due times are skipped silently.

The job is created with jobs.submission (the API's code path), owned by the schedule's key, linked to the schedule.
"""
from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter
from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert as pg_insert

from . import kinds, submission
from .config import Settings
from .models import ApiKey, Schedule, ScheduleRun
from .queue import BROKER_ERRORS, enqueue_unsent
from .spec import JobCreate, ScheduleCreate
from .submission import Invalid

log = logging.getLogger(__name__)


def _error(field: str, message: str, type_: str = "value_error") -> dict:
    return {"field": field, "message": message, "type": type_}


def check(schedule: ScheduleCreate, settings: Settings) -> None:
    """What pydantic cannot check: the cron expression, the timezone, the file path, and (inline items) the same
    checks as a submission. Raises Invalid."""
    errors = []
    fields = schedule.cron.split()
    cron_ok = len(fields) == 5 and croniter.is_valid(schedule.cron)
    if not cron_ok:
        errors.append(_error("cron", "not a valid 5-field cron expression (minute hour day month weekday)"))
    try:
        zone(schedule.timezone)
    except ValueError as exc:
        errors.append(_error("timezone", str(exc)))
    else:
        if cron_ok:
            try:  # valid syntax can still never match (say, February 30)
                now = datetime.now(timezone.utc)
                next_due(schedule.cron, schedule.timezone, now)
                latest_due(schedule.cron, schedule.timezone, now)
            except Exception:  # noqa: BLE001 - croniter raises several kinds
                errors.append(_error("cron", "the expression never matches a date"))
    if schedule.source.kind == "file":
        try:
            input_path(schedule.source.path, settings)
        except ValueError as exc:
            errors.append(_error("source.path", str(exc)))
        # The items come at run time; the template alone must already be a job this server accepts.
        limit = settings.max_new_tokens_limit
        if (schedule.job.params.max_new_tokens or 0) > limit:
            errors.append(_error("job.params.max_new_tokens", f"at most {limit} on this server", "less_than_equal"))
    # The kind's own job fields are part of the template: checked here for file sources too.
    errors += [_error(f"job.{field}", f"not taken by a {schedule.job.type} job")
               for field in kinds.get(schedule.job.type).refused_fields(schedule.job)]
    if errors:
        raise Invalid(errors)
    if schedule.source.kind == "inline":
        if len(schedule.source.items) > settings.max_items_per_job:
            raise Invalid([_error("source.items", f"a job holds at most {settings.max_items_per_job} items",
                                  "too_long")], 413, "Too many items")
        try:
            submission.prepare(job_create(schedule, schedule.source.items), settings)
        except Invalid as exc:
            raise Invalid([{**e, "field": "source." + e["field"]} for e in exc.errors]) from None


def zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, TypeError, OSError):
        raise ValueError(f"unknown timezone {name!r}; use an IANA name such as UTC or Europe/Berlin") from None


def input_path(relative: str, settings: Settings) -> Path:
    """The file under SCHEDULE_INPUT_DIR that `relative` names. Raises ValueError for anything outside it."""
    if not settings.schedule_input_dir:
        raise ValueError("file sources are disabled on this server (SCHEDULE_INPUT_DIR is not set)")
    if "\x00" in relative or os.path.isabs(relative):
        raise ValueError("a path relative to the server's input directory")
    root = Path(settings.schedule_input_dir).resolve()
    path = (root / relative).resolve()  # symlinks and .. resolved: what would really be opened
    if path == root or not path.is_relative_to(root):
        raise ValueError("the path leaves the server's input directory")
    return path


def job_create(schedule: ScheduleCreate, items) -> JobCreate:
    """The template plus the items, validated like a submission. Raises Invalid (naming the first error)."""
    options = schedule.job.model_dump()
    try:
        return JobCreate.model_validate({**options, "items": [i if isinstance(i, dict) else
                                                              i.model_dump(exclude_none=True) for i in items]})
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        raise Invalid([_error(".".join(map(str, first["loc"])), first["msg"], first["type"])]) from None


def read_items(path: Path, settings: Settings) -> list[dict]:
    """The JSONL file's items (validated later with the job). Raises Invalid."""
    items = []
    with path.open("rb") as handle:
        if os.fstat(handle.fileno()).st_size > settings.max_request_bytes:
            raise Invalid([_error("source.path", f"the file is over {settings.max_request_bytes} bytes",
                                  "too_long")], 413)
        for number, raw in enumerate(handle, start=1):
            if not raw.strip():
                continue
            if len(items) == settings.max_items_per_job:
                raise Invalid([_error("source.path", f"more than {settings.max_items_per_job} items", "too_long")],
                              413)
            try:
                items.append(json.loads(raw))
            except (ValueError, UnicodeDecodeError) as exc:
                raise Invalid([{**_error("source.path", f"line {number}: not valid JSON: {exc}", "json_invalid"),
                                "line": number}], 400) from None
    return items


def as_create(row: Schedule) -> ScheduleCreate:
    return ScheduleCreate.model_validate({"name": row.name, "cron": row.cron, "timezone": row.timezone,
                                          "job": row.template, "source": row.source, "enabled": row.enabled})


def build_job(row: Schedule, settings: Settings) -> tuple[JobCreate, list]:
    """The job of one run, validated like a submission. Raises Invalid (or OSError for an unreadable file)."""
    spec = as_create(row)
    if spec.source.kind == "inline":
        items = spec.source.items
    else:
        items = read_items(input_path(spec.source.path, settings), settings)
    job_in = job_create(spec, items)
    return job_in, submission.prepare(job_in, settings)


# ------------------------------------------------------------------------------------------------ timing
def next_due(cron: str, tz: str, after: datetime) -> datetime:
    """The first due time strictly after `after`, as an aware UTC datetime."""
    local = after.astimezone(zone(tz))
    return croniter(cron, local).get_next(datetime).astimezone(timezone.utc)


def latest_due(cron: str, tz: str, now: datetime) -> datetime:
    """The latest due time at or before `now` (UTC)."""
    local = (now.replace(microsecond=0) + timedelta(seconds=1)).astimezone(zone(tz))
    return croniter(cron, local).get_prev(datetime).astimezone(timezone.utc)


def due_now(row: Schedule, now: datetime) -> datetime | None:
    """The due time to run now, if any: the latest one at or before `now` that is after the last handled one (or
    after the schedule's creation)."""
    since = row.last_due_at or row.created_at
    latest = latest_due(row.cron, row.timezone, now)
    return latest if latest > since else None


# ------------------------------------------------------------------------------------------------ dispatch
@dataclass
class Dispatched:
    schedule_id: object
    due_at: datetime
    job_id: object | None
    error: str | None


def dispatch(Session, celery, settings: Settings, now: datetime | None = None) -> list[Dispatched]:
    """Create the job of every schedule that is due at `now` (default: the current time) and has not run for that
    due time yet. Returns what this call created (a concurrent dispatcher's runs are not in it)."""
    now = now or datetime.now(timezone.utc)
    with Session() as session:
        ids = session.scalars(select(Schedule.id).join(ApiKey, Schedule.api_key_id == ApiKey.id)
                              .where(Schedule.enabled, ApiKey.revoked_at.is_(None)).order_by(Schedule.id)).all()
    out = []
    for schedule_id in ids:
        try:
            done = _dispatch_one(Session, celery, settings, schedule_id, now)
        except Exception:  # noqa: BLE001 - one broken schedule must not stop the others
            log.exception("dispatching schedule %s failed", schedule_id)
            continue
        if done is not None:
            out.append(done)
    return out


def _dispatch_one(Session, celery, settings, schedule_id, now) -> Dispatched | None:
    with Session() as session:
        row = session.scalar(select(Schedule).where(Schedule.id == schedule_id, Schedule.enabled)
                             .with_for_update(skip_locked=True))
        if row is None:  # deleted, disabled, or another dispatcher holds it right now
            return None
        due = due_now(row, now)
        if due is None:
            return None
        row.last_due_at = due
        run_id = session.scalar(pg_insert(ScheduleRun).values(schedule_id=row.id, due_at=due)
                                .on_conflict_do_nothing().returning(ScheduleRun.id))
        if run_id is None:  # this due time already ran
            session.commit()
            return None
        run = session.get(ScheduleRun, run_id)
        job = None
        try:
            job_in, prepared = build_job(row, settings)
            job = submission.create(session, job_in, prepared, settings, api_key_id=row.api_key_id,
                                    idempotency_key=f"schedule:{row.id}:{due.isoformat()}", schedule_id=row.id)
            run.job_id = job.id
        except Invalid as exc:
            run.error = "; ".join(f"{e['field']}: {e['message']}" for e in exc.errors)[:2000]
        except OSError as exc:
            run.error = f"cannot read the input file: {exc.__class__.__name__}: {exc.strerror or exc}"[:2000]
        session.commit()
        result = Dispatched(row.id, due, job.id if job else None, run.error)
        if job is not None:
            log.info("schedule %s: created job %s for %s", row.id, job.id, due.isoformat(),
                     extra={"job_id": str(job.id), "schedule_id": str(row.id)})
            try:
                enqueue_unsent(session, celery, job_id=job.id)
                session.commit()
            except BROKER_ERRORS:  # the job is stored; the requeue task sends its items when the broker is back
                session.rollback()
                log.warning("broker unavailable: job %s of schedule %s is stored, its items are sent later",
                            job.id, row.id, extra={"job_id": str(job.id)})
        else:
            log.warning("schedule %s: no job for %s: %s", row.id, due.isoformat(), run.error)
        return result

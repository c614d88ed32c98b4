"""/v1/schedules: create, list, get, update and delete the caller's scheduled jobs (HTTP only; the logic is in
jobs/schedules.py). Another key's schedule is 404."""
from __future__ import annotations

import uuid
from datetime import datetime, timezone

from flask import Blueprint, current_app, url_for
from sqlalchemy import select

from jobs import schedules
from jobs.models import Schedule, ScheduleRun
from jobs.spec import ScheduleCreate, ScheduleUpdate
from jobs.submission import Invalid

from . import auth
from .errors import ApiError, invalid
from .views import json_body, validate

bp = Blueprint("schedules", __name__)
RECENT_RUNS = 20


def state():
    return current_app.extensions["jobs"]


def checked(spec: ScheduleCreate) -> ScheduleCreate:
    try:
        schedules.check(spec, state().settings)
    except Invalid as exc:
        raise invalid(exc.errors, exc.status, exc.title) from None
    return spec


def get_schedule(session, schedule_id: str, lock: bool = False) -> Schedule:
    try:
        query = select(Schedule).where(Schedule.id == uuid.UUID(schedule_id), Schedule.api_key_id == auth.key_id())
    except ValueError:
        query = None
    row = session.scalar(query.with_for_update() if lock else query) if query is not None else None
    if row is None:
        raise ApiError(404, "Not Found", f"no schedule {schedule_id!r}")
    return row


def schedule_out(row: Schedule, runs: list[ScheduleRun] | None = None) -> dict:
    source = dict(row.source)
    if source.get("kind") == "inline":
        source = {"kind": "inline", "item_count": len(source["items"]), "items": source["items"]}
    now = datetime.now(timezone.utc)
    out = {"id": str(row.id), "object": "schedule", "name": row.name, "cron": row.cron, "timezone": row.timezone,
           "job": row.template, "source": source, "enabled": row.enabled,
           "created_at": row.created_at.isoformat(),
           "last_due_at": row.last_due_at.isoformat() if row.last_due_at else None,
           "next_due_at": schedules.next_due(row.cron, row.timezone, max(now, row.last_due_at or now)).isoformat()
           if row.enabled else None}
    if runs is not None:
        out["runs"] = [{"due_at": r.due_at.isoformat(), "job_id": str(r.job_id) if r.job_id else None,
                        "error": r.error, "created_at": r.created_at.isoformat()} for r in runs]
    return out


def store_fields(row: Schedule, spec: ScheduleCreate) -> None:
    row.name, row.cron, row.timezone, row.enabled = spec.name, spec.cron, spec.timezone, spec.enabled
    row.template = spec.job.model_dump(mode="json")
    row.source = spec.source.model_dump(mode="json", exclude_none=True)


@bp.post("/v1/schedules")
def create_schedule():
    spec = checked(validate(ScheduleCreate, json_body()))
    with state().Session.begin() as session:
        row = Schedule(api_key_id=auth.key_id())
        store_fields(row, spec)
        session.add(row)
        session.flush()
        session.refresh(row)
        body = schedule_out(row, [])
    return body, 201, {"Location": url_for(".get_schedule_view", schedule_id=body["id"])}


@bp.get("/v1/schedules")
def list_schedules():
    with state().Session() as session:
        rows = session.scalars(select(Schedule).where(Schedule.api_key_id == auth.key_id())
                               .order_by(Schedule.created_at.desc(), Schedule.id.desc()).limit(1000)).all()
        return {"object": "list", "data": [schedule_out(r) for r in rows]}


@bp.get("/v1/schedules/<schedule_id>")
def get_schedule_view(schedule_id: str):
    with state().Session() as session:
        row = get_schedule(session, schedule_id)
        runs = session.scalars(select(ScheduleRun).where(ScheduleRun.schedule_id == row.id)
                               .order_by(ScheduleRun.due_at.desc()).limit(RECENT_RUNS)).all()
        return schedule_out(row, list(runs))


@bp.patch("/v1/schedules/<schedule_id>")
def update_schedule(schedule_id: str):
    patch = validate(ScheduleUpdate, json_body())
    with state().Session.begin() as session:
        row = get_schedule(session, schedule_id, lock=True)
        current = schedules.as_create(row).model_dump(mode="json", exclude_none=True)
        merged = {**current, **patch.model_dump(mode="json", exclude_unset=True, exclude_none=True)}
        spec = checked(validate(ScheduleCreate, merged))
        timing_changed = (spec.cron, spec.timezone) != (row.cron, row.timezone) or (spec.enabled and not row.enabled)
        store_fields(row, spec)
        if timing_changed:  # due times before now are not caught up after a change of timing or re-enabling
            row.last_due_at = datetime.now(timezone.utc)
        session.flush()
        return schedule_out(row)


@bp.delete("/v1/schedules/<schedule_id>")
def delete_schedule(schedule_id: str):
    """The schedule's jobs stay (their schedule link becomes null)."""
    with state().Session.begin() as session:
        session.delete(get_schedule(session, schedule_id, lock=True))
    return "", 204

"""Creating a job: the one code path used by POST /v1/jobs, POST /generate and the schedule dispatcher.

`prepare` runs the checks that need the settings or the model; `create` stores the job and its items in the caller's
transaction; `submit` does both transactions of an API submission (store, then send the items to the broker).
Errors are raised as the exceptions below; api/ turns them into problems.
"""
from __future__ import annotations

import hashlib
import uuid

from sqlalchemy import func, insert, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from . import kinds, limits
from .config import Settings
from .models import ApiKey, Item, Job
from .queue import BROKER_ERRORS, enqueue_unsent
from .spec import DEFAULT_PARAMS, ItemIn, JobCreate

MAX_REPORTED_ERRORS = 50


class Invalid(Exception):
    """The submission is invalid: `errors` = [{field, message, type}], answered with `status`."""

    def __init__(self, errors: list[dict], status: int = 422, title: str = "Invalid request"):
        super().__init__(errors[0]["message"])
        self.errors, self.status, self.title = errors, status, title


class IdempotencyConflict(Exception):
    def __init__(self, job_id):
        super().__init__("this Idempotency-Key was used for a different request")
        self.job_id = job_id


class BrokerDown(Exception):
    """The job is stored, but its items could not be sent (they are sent later; see enqueue_unsent)."""

    def __init__(self, job_id, cause: Exception):
        super().__init__(cause.__class__.__name__)
        self.job_id, self.cause = job_id, cause


class QuotaExceeded(Exception):
    """The key already has `queued` items queued or running; a job of `adding` more would pass `limit`."""

    def __init__(self, queued: int, adding: int, limit: int):
        super().__init__(f"{queued} items of this key are queued or running; {adding} more would exceed the limit "
                         f"of {limit}")
        self.queued, self.adding, self.limit = queued, adding, limit


def job_params(job: JobCreate) -> dict:
    """The job's params with defaults filled in (what the API reports)."""
    return {**DEFAULT_PARAMS, **job.params.model_dump(exclude_none=True)}


def item_params(params: dict, item: ItemIn) -> dict:
    """An item's effective decode params: defaults < job params < the item's overrides."""
    own = item.model_dump(exclude_none=True, exclude={"custom_id", "prompt", "messages"})
    return {k: v for k, v in {**params, **own}.items() if k != "measure_baseline"}


def prepare(job: JobCreate, settings: Settings, single: bool = False) -> list[tuple[str, dict]]:
    """Checks that need the settings or the model: custom_id uniqueness, max_new_tokens, prompt vs context.
    Returns each item's (custom_id, effective params); custom_id defaults to the position.
    `single`: name fields as POST /generate's body does. Raises Invalid."""
    params = job_params(job)
    kind = kinds.get(job.type)
    options = kind.options(job)
    errors = [{"field": field, "type": "value_error", "message": f"not taken by a {job.type} job"}
              for field in kind.refused_fields(job)]
    seen, prepared = {}, []
    for i, item in enumerate(job.items):
        custom_id = item.custom_id if item.custom_id is not None else str(i)
        if custom_id in seen:
            errors.append({"field": f"items[{i}].custom_id", "type": "value_error",
                           "message": f"duplicate custom_id {custom_id!r} (also items[{seen[custom_id]}])"})
        seen.setdefault(custom_id, i)
        effective = item_params(params, item)
        prepared.append((custom_id, effective))
        if effective["max_new_tokens"] > settings.max_new_tokens_limit:
            where = "params." if item.max_new_tokens is None else f"items[{i}]."
            errors.append({"field": ("" if single else where) + "max_new_tokens",
                           "type": "less_than_equal",
                           "message": f"at most {settings.max_new_tokens_limit} on this server"})
        elif refused := kind.check_item(item.prompt, item.turns()):
            errors.append({"field": f"items[{i}].{refused[0]}", "type": "value_error", "message": refused[1]})
        elif message := limits.too_long(settings.target, job.type, item.prompt, effective["max_new_tokens"],
                                        item.turns(), options):
            name = "prompt" if item.messages is None else "messages"
            errors.append({"field": name if single else f"items[{i}].{name}", "type": "too_long",
                           "message": message})
        if len(errors) >= MAX_REPORTED_ERRORS:
            break
    if errors:
        raise Invalid(errors)
    return prepared


def baseline_sample(total: int, size: int) -> set[int]:
    """Positions of the items also decoded without speculation: `size` of them, spread over the job."""
    n = min(total, size)
    return {j * total // n for j in range(n)} if n else set()


def request_hash(job_in: JobCreate) -> str:
    # Unset kind fields are left out, so a job submitted before they existed hashes as it did then.
    unset = {field for field in kinds.KIND_FIELDS if getattr(job_in, field) is None}
    return hashlib.sha256(job_in.model_dump_json(exclude=unset).encode()).hexdigest()


def create(session: Session, job_in: JobCreate, prepared: list[tuple[str, dict]], settings: Settings, *,
           api_key_id: int | None, idempotency_key: str | None = None, schedule_id: uuid.UUID | None = None) -> Job:
    """Insert the job and its items (not yet sent: enqueued_at NULL). The caller commits, then enqueues."""
    params = job_params(job_in)
    job = Job(type=job_in.type, priority=job_in.priority, params=params, metadata_=job_in.metadata,
              options=kinds.get(job_in.type).options(job_in),
              idempotency_key=idempotency_key, request_hash=request_hash(job_in), total_items=len(job_in.items),
              api_key_id=api_key_id, schedule_id=schedule_id)
    session.add(job)
    session.flush()
    sample = baseline_sample(len(job_in.items), settings.baseline_sample_size) if params["measure_baseline"] else set()
    session.execute(insert(Item), [
        {"job_id": job.id, "idx": i, "custom_id": custom_id, "prompt": item.prompt, "messages": item.turns(),
         "params": effective, "baseline_sample": i in sample}
        for i, (item, (custom_id, effective)) in enumerate(zip(job_in.items, prepared))])
    return job


def active_items(session: Session, api_key_id: int) -> int:
    """Items of this key's jobs that are queued or running (what the max-queued-items limit counts)."""
    return session.scalar(select(func.count()).select_from(Item).join(Job)
                          .where(Job.api_key_id == api_key_id, Item.status.in_(("queued", "running")))) or 0


def check_quota(session: Session, api_key_id: int, adding: int, limit: int) -> None:
    """Raise QuotaExceeded if `adding` more items would pass the key's limit of queued + running items."""
    # The key's row lock serializes its submissions, so two concurrent ones cannot both pass the limit.
    session.execute(select(ApiKey.id).where(ApiKey.id == api_key_id).with_for_update())
    active = active_items(session, api_key_id)
    if active + adding > limit:
        raise QuotaExceeded(active, adding, limit)


def submit(Session, celery, settings: Settings, job_in: JobCreate, prepared: list[tuple[str, dict]], *,
           api_key_id: int, idempotency_key: str | None = None, max_active_items: int | None = None
           ) -> tuple[Job, bool]:
    """Create the job (or find the one this key's Idempotency-Key made) and send its unsent items to the queue.
    Returns (job, replayed). Raises IdempotencyConflict, QuotaExceeded, BrokerDown."""
    digest = request_hash(job_in)

    def find(session):
        if not idempotency_key:
            return None
        return session.scalar(select(Job).where(Job.api_key_id == api_key_id, Job.idempotency_key == idempotency_key))

    with Session() as session:
        job = find(session)
        replayed = job is not None
        if job is None:
            if max_active_items is not None:
                check_quota(session, api_key_id, len(job_in.items), max_active_items)
            try:  # the unique (api_key_id, idempotency_key) fires at the job's flush, or at the commit
                job = create(session, job_in, prepared, settings, api_key_id=api_key_id,
                             idempotency_key=idempotency_key)
                session.commit()
            except IntegrityError:  # a concurrent request with the same key won: nothing of ours is stored
                session.rollback()
                job, replayed = find(session), True
                if job is None:
                    raise
        if replayed and job.request_hash != digest:
            raise IdempotencyConflict(job.id)
        try:
            enqueue_unsent(session, celery, job_id=job.id)
            session.commit()
        except BROKER_ERRORS as exc:
            session.rollback()
            raise BrokerDown(job.id, exc) from None
        session.refresh(job)
        return job, replayed

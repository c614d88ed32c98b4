"""OpenAI-style batches on top of jobs: an input file's valid lines become one job's items; everything a batch
reports (status, request_counts, usage, timestamps) is read from that job, so Postgres stays the one source of
truth. What the job cannot hold is kept on the batch row: the lines that could not run (with their line numbers),
the expiry, and the output and error files, written once when the job is final (`refresh`, called on every read).

Lines are validated exactly as the synchronous route validates its body (jobs/openai_spec.py) and then as a job item
(context length, max_new_tokens). A bad line does not fail the batch: it goes to the error file with its custom_id
and line number, and the other lines run. The batch fails as a whole only when no line can run, when custom_ids
repeat (results could not be joined), or when it has more lines than a job may hold.
"""
from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from pydantic import ValidationError
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from . import files, lifecycle, submission
from .config import Settings
from .models import Batch, File, Item, ItemResult, Job
from .openai_format import ENDPOINTS, model_id, response_body
from .openai_spec import BatchLine
from .queue import BROKER_ERRORS, enqueue_unsent
from .spec import ItemIn, JobCreate, check_text

WINDOW = timedelta(hours=24)
OUTPUT_RETENTION = timedelta(days=30)  # output and error files are deleted after this
MAX_LISTED_ERRORS = 1000  # on the batch object; the error file has every one


def new_id(prefix: str) -> str:
    return prefix + secrets.token_hex(12)


def now() -> datetime:
    return datetime.now(timezone.utc)


def ts(value: datetime | None) -> int | None:
    return None if value is None else int(value.timestamp())


# ------------------------------------------------------------------------------------------------ validation
@dataclass
class Parsed:
    items: list[ItemIn] = field(default_factory=list)
    prepared: list[tuple[str, dict]] = field(default_factory=list)
    errors: list[dict] = field(default_factory=list)  # lines that will not run
    fatal: list[dict] = field(default_factory=list)  # reasons the whole batch fails
    total: int = 0


def line_error(number: int, custom_id, code: str, message: str, param: str | None = None) -> dict:
    return {"line": number, "custom_id": custom_id, "code": code, "message": f"line {number}: {message}",
            "param": param}


def param_of(exc: ValidationError, prefix: str = "") -> tuple[str | None, str]:
    first = exc.errors(include_url=False)[0]
    loc = ".".join(str(part) for part in first["loc"])
    return (prefix + loc if loc else prefix.rstrip(".") or None), first["msg"]


def storable_id(value) -> str | None:
    """A custom_id as it may be echoed in the error file (Postgres cannot store NUL or a lone surrogate)."""
    if not isinstance(value, str) or len(value) > 256:
        return None
    try:
        return check_text(value)
    except ValueError:
        return None


def parse_line(raw: bytes, number: int, endpoint: str, model: str) -> ItemIn | dict:
    """An input line as a job item, or its line error."""
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        return line_error(number, None, "invalid_json", f"not valid JSON ({exc.__class__.__name__})")
    custom_id = storable_id(data.get("custom_id")) if isinstance(data, dict) else None
    try:
        line = BatchLine.model_validate(data)
    except ValidationError as exc:
        param, message = param_of(exc)
        return line_error(number, custom_id, "invalid_request", f"{param}: {message}", param)
    if line.url != endpoint:
        return line_error(number, custom_id, "invalid_url", f"url {line.url!r} is not the batch's endpoint "
                          f"{endpoint!r}", "url")
    try:
        request = ENDPOINTS[endpoint].request.model_validate(line.body)
    except ValidationError as exc:
        param, message = param_of(exc, "body.")
        return line_error(number, custom_id, "invalid_request", f"{param}: {message}", param)
    if request.model != model:
        return line_error(number, custom_id, "model_not_found", f"model {request.model!r} is not served here "
                          f"(this server serves {model!r})", "body.model")
    if request.stream:
        return line_error(number, custom_id, "invalid_request", "stream is not available in a batch", "body.stream")
    return request.item(custom_id=line.custom_id)


def parse(content: bytes, endpoint: str, settings: Settings) -> Parsed:
    """Every non-blank line of an input file, as a job item or a line error."""
    parsed, seen, model = Parsed(), {}, model_id(settings.target)
    for number, raw in enumerate(content.splitlines(), start=1):
        if not raw.strip():
            continue
        parsed.total += 1
        if parsed.total > settings.max_items_per_job:
            parsed.fatal = [line_error(number, None, "too_many_requests",
                                       f"a batch holds at most {settings.max_items_per_job} requests")]
            return parsed
        result = parse_line(raw, number, endpoint, model)
        custom_id = result.custom_id if isinstance(result, ItemIn) else result["custom_id"]
        if custom_id is not None and custom_id in seen:
            parsed.fatal.append(line_error(number, custom_id, "duplicate_custom_id",
                                           f"custom_id {custom_id!r} is also on line {seen[custom_id]}", "custom_id"))
        seen.setdefault(custom_id, number)
        if isinstance(result, dict):
            parsed.errors.append(result)
            continue
        check_item(parsed, result, number, settings)
    return parsed


def check_item(parsed: Parsed, item: ItemIn, number: int, settings: Settings) -> None:
    """The job-level checks (context length, max_new_tokens on this server) for one line."""
    try:
        prepared = submission.prepare(JobCreate(items=[item]), settings, single=True)
    except submission.Invalid as exc:
        error = exc.errors[0]
        parsed.errors.append(line_error(number, item.custom_id, "invalid_request", error["message"],
                                        "body." + error["field"]))
        return
    parsed.items.append(item)
    parsed.prepared += prepared


# ------------------------------------------------------------------------------------------------ creation
def create(Session, celery, settings: Settings, api_key_id: int, input_file: File, endpoint: str,
           metadata: dict | None) -> str:
    """Validate the input file and store the batch with its job in one transaction, then queue the items (if the
    broker is down they stay unsent in Postgres and beat sends them; the batch is still created). Returns its id.
    Raises submission.QuotaExceeded."""
    parsed = parse(files.read(settings, input_file), endpoint, settings)
    created = now()
    batch = Batch(id=new_id("batch_"), api_key_id=api_key_id, endpoint=endpoint, model=model_id(settings.target),
                  input_file_id=input_file.id, completion_window="24h", metadata_=metadata,
                  total_requests=parsed.total, line_errors=parsed.fatal or parsed.errors, created_at=created,
                  expires_at=created + WINDOW)
    if parsed.fatal or not parsed.items:
        if not parsed.fatal and not parsed.errors:
            batch.line_errors = [{"line": None, "custom_id": None, "code": "empty_file",
                                  "message": "the input file has no requests", "param": "input_file_id"}]
        batch.failed_at = created
    with Session() as session:
        if batch.failed_at is None:
            submission.check_quota(session, api_key_id, len(parsed.items), settings.max_queued_items_per_key)
            job_in = JobCreate(items=parsed.items, metadata={"batch": batch.id})
            batch.job_id = submission.create(session, job_in, parsed.prepared, settings, api_key_id=api_key_id).id
        session.add(batch)
        session.commit()
        if batch.job_id is not None:
            try:
                enqueue_unsent(session, celery, job_id=batch.job_id)
                session.commit()
            except BROKER_ERRORS:
                session.rollback()
        return batch.id


# ------------------------------------------------------------------------------------------------ reading
def refresh(session: Session, batch: Batch, settings: Settings) -> Job | None:
    """Bring a batch up to date under its row lock: cancel it once past its window (expired, partial results
    kept), and write its output and error files once its job is final. Returns its job."""
    session.execute(select(Batch.id).where(Batch.id == batch.id).with_for_update())
    session.refresh(batch)
    job = session.get(Job, batch.job_id, populate_existing=True) if batch.job_id else None
    if job is not None and job.status not in lifecycle.JOB_FINAL and batch.expired_at is None \
            and now() > batch.expires_at:
        batch.expired_at = now()
        if job.status != "cancelling":
            lifecycle.cancel(session, job.id)
    if job is not None and job.status in lifecycle.JOB_FINAL and batch.finalized_at is None:
        write_files(session, batch, job, settings)
    return job


def write_files(session: Session, batch: Batch, job: Job, settings: Settings) -> None:
    """The output file (completed requests) and the error file (lines that could not run, failed and cancelled
    requests): every custom_id of the input is in exactly one of them."""
    output, errors = [], [error_line(batch, e) for e in batch.line_errors]
    rows = session.execute(select(Item, ItemResult).join(ItemResult).where(Item.job_id == job.id)
                           .order_by(Item.idx)).all()
    for item, result in rows:
        (output if item.status == "completed" else errors).append(result_line(batch, job, item, result))
    batch.output_file_id = store_lines(session, batch, "output", output, settings)
    batch.error_file_id = store_lines(session, batch, "error", errors, settings)
    batch.finalized_at = now()


def store_lines(session: Session, batch: Batch, kind: str, lines: list[dict], settings: Settings) -> str | None:
    if not lines:
        return None
    content = "".join(json.dumps(line) + "\n" for line in lines).encode()
    file = File(id=new_id("file-"), api_key_id=batch.api_key_id, purpose="batch_output",
                filename=f"{batch.id}_{kind}.jsonl", expires_at=now() + OUTPUT_RETENTION)
    files.store(settings, file, content)
    session.add(file)
    return file.id


def result_line(batch: Batch, job: Job, item: Item, result: ItemResult) -> dict:
    """One output or error line in OpenAI's format. The response body is what the sync route returns, with the
    `eagle3` extension field (tau, tokens/s, speedup) of that request."""
    line = {"id": f"batch_req_{item.id}", "custom_id": item.custom_id, "response": None, "error": None}
    request_id = f"req_{job.id.hex[:12]}_{item.idx}"
    if item.status == "completed":
        prefix = ENDPOINTS[batch.endpoint].id_prefix
        body = response_body(batch.endpoint, f"{prefix}-{job.id.hex[:12]}-{item.idx}", ts(item.finished_at),
                             batch.model, result.output, result.stats, result.baseline_stats)
        line["response"] = {"status_code": 200, "request_id": request_id, "body": body}
    elif item.status == "cancelled":
        code = "batch_expired" if batch.expired_at else "batch_cancelled"
        line["error"] = {"code": code, "message": f"the batch was {code[6:]} before this request ran"}
    else:
        body = {"error": {"message": result.error, "type": "server_error", "param": None, "code": None}}
        line["response"] = {"status_code": 500, "request_id": request_id, "body": body}
    return line


def error_line(batch: Batch, error: dict) -> dict:
    """A line that never ran: the 400 the sync route would have answered."""
    body = {"error": {"message": error["message"], "type": "invalid_request_error", "param": error["param"],
                      "code": error["code"]}}
    return {"id": f"batch_req_{batch.id[6:]}_line{error['line']}", "custom_id": error["custom_id"],
            "response": {"status_code": 400, "request_id": None, "body": body}, "error": None}


def status(batch: Batch, job: Job | None) -> str:
    if batch.failed_at is not None or job is None:
        return "failed"
    if job.status in ("queued", "running"):
        return "in_progress"
    if job.status == "cancelling":
        return "cancelling"
    if job.status == "cancelled":
        return "expired" if batch.expired_at else "cancelled"
    return "completed" if batch.finalized_at else "finalizing"


def usage(session: Session, job: Job | None) -> dict:
    tokens_in = tokens_out = 0
    if job is not None:
        tokens_in, tokens_out = session.execute(
            select(func.coalesce(func.sum(ItemResult.stats["prompt_tokens"].as_integer()), 0),
                   func.coalesce(func.sum(func.jsonb_array_length(ItemResult.output["token_ids"])), 0))
            .join(Item).where(Item.job_id == job.id, Item.status == "completed")).one()
    return {"input_tokens": tokens_in, "output_tokens": tokens_out, "total_tokens": tokens_in + tokens_out,
            "input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}}


def batch_object(session: Session, batch: Batch, job: Job | None) -> dict:
    """The OpenAI batch object. request_counts: completed + failed = total once the batch is final (cancelled and
    expired requests count as failed: they are in the error file)."""
    state = status(batch, job)
    final = job is not None and job.status in lifecycle.JOB_FINAL
    cancelled = state in ("cancelled", "expired")
    failed = len(batch.line_errors) + (job.failed_items + job.cancelled_items if job else 0)
    listed = [{k: e[k] for k in ("code", "message", "param", "line")} for e in batch.line_errors]
    return {
        "id": batch.id, "object": "batch", "endpoint": batch.endpoint, "model": batch.model,
        "errors": {"object": "list", "data": listed[:MAX_LISTED_ERRORS]} if listed else None,
        "input_file_id": batch.input_file_id, "completion_window": batch.completion_window, "status": state,
        "output_file_id": batch.output_file_id, "error_file_id": batch.error_file_id,
        "created_at": ts(batch.created_at), "in_progress_at": None if job is None else ts(batch.created_at),
        "expires_at": ts(batch.expires_at),
        "finalizing_at": ts(job.finished_at) if final and not cancelled else None,
        "completed_at": ts(batch.finalized_at) if state == "completed" else None,
        "failed_at": ts(batch.failed_at), "expired_at": ts(batch.expired_at),
        "cancelling_at": ts(job.cancel_requested_at) if job is not None and not batch.expired_at else None,
        "cancelled_at": ts(job.finished_at) if state == "cancelled" else None,
        "request_counts": {"total": batch.total_requests, "completed": job.completed_items if job else 0,
                           "failed": failed},
        "usage": usage(session, job), "metadata": batch.metadata_,
        "job_id": str(job.id) if job is not None else None,
    }


def cancel(session: Session, batch: Batch, settings: Settings) -> Job:
    """Queued requests will not run; running ones finish and keep their results. Raises lifecycle.Conflict."""
    job = refresh(session, batch, settings)
    if job is None or job.status in ("completed", "failed"):
        raise lifecycle.Conflict(f"the batch is already {status(batch, job)}")
    lifecycle.cancel(session, job.id)
    return job

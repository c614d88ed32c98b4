"""/v1/jobs and /generate."""
from __future__ import annotations

import base64
import json
import time
import uuid
from datetime import datetime

from flask import Blueprint, Response, current_app, jsonify, request, url_for
from pydantic import BaseModel, ValidationError
from sqlalchemy import select, tuple_

from jobs import kinds, lifecycle, submission
from jobs.models import Item, ItemResult, Job
from jobs.queue import MAX_PRIORITY

from . import auth
from .errors import ApiError, invalid, validation_errors
from .schemas import (DEFAULT_PARAMS, GenerateOut, GenerateRequest, ItemIn, JobCreate, JobList, JobOptions, JobOut,
                      ListJobsQuery, ResultList, ResultOut, ResultsQuery)

bp = Blueprint("jobs", __name__)
MAX_REPORTED_ERRORS = submission.MAX_REPORTED_ERRORS
PARAM_ORDER = [*DEFAULT_PARAMS, "stop", "measure_baseline"]


def state():
    return current_app.extensions["jobs"]


# ----------------------------------------------------------------------------------------------- parsing
def validate(model: type[BaseModel], data, prefix=(), lines=None):
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise invalid(validation_errors(exc, prefix, lines)[:MAX_REPORTED_ERRORS]) from None


def parse_json(raw):
    """json.loads, with nesting too deep for the parser reported as invalid JSON (ValueError), not RecursionError."""
    try:
        return json.loads(raw)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def json_body():
    if request.mimetype != "application/json":
        raise ApiError(415, "Unsupported Media Type", "send Content-Type: application/json")
    try:
        return parse_json(request.get_data())
    except (ValueError, UnicodeDecodeError) as exc:
        raise invalid([{"field": "body", "message": f"not valid JSON: {exc}", "type": "json_invalid"}], 400,
                      "Malformed JSON") from None


def too_many(count: int) -> ApiError:
    limit = state().settings.max_items_per_job
    return invalid([{"field": "items", "message": f"{count} items or more; a job holds at most {limit}",
                     "type": "too_long"}], 413, "Too many items")


def read_submission() -> JobCreate:
    """A JSON job body, or a multipart upload: `file` = JSONL (one item per line), `job` = JSON of the job fields."""
    max_items = state().settings.max_items_per_job
    if request.mimetype != "multipart/form-data":
        data = json_body()
        if isinstance(data, dict) and isinstance(data.get("items"), list) and len(data["items"]) > max_items:
            raise too_many(len(data["items"]))
        return validate(JobCreate, data)

    upload = request.files.get("file")
    if upload is None:
        raise invalid([{"field": "file", "message": "a JSONL file part named 'file' is required",
                        "type": "missing"}])
    try:
        options = parse_json(request.form.get("job", "{}"))
    except ValueError as exc:
        raise invalid([{"field": "job", "message": f"not valid JSON: {exc}", "type": "json_invalid"}], 400,
                      "Malformed JSON") from None
    options = validate(JobOptions, options, prefix=("job",))
    items, lines = [], []
    for number, raw in enumerate(upload.stream, start=1):
        if not raw.strip():
            continue
        if len(items) == max_items:
            raise too_many(max_items + 1)
        try:
            items.append(parse_json(raw))
        except (ValueError, UnicodeDecodeError) as exc:
            raise invalid([{"field": "file", "line": number, "message": f"not valid JSON: {exc}",
                            "type": "json_invalid"}], 400, "Malformed JSONL") from None
        lines.append(number)
    return validate(JobCreate, {**options.model_dump(), "items": items}, lines=lines)


def idempotency_key() -> str | None:
    key = request.headers.get("Idempotency-Key")
    if key is not None and not (1 <= len(key) <= 255 and key.isprintable()):
        raise invalid([{"field": "Idempotency-Key", "message": "1 to 255 printable characters",
                        "type": "string_type"}])
    return key


# ------------------------------------------------------------------------------------------ job creation
def check_items(job: JobCreate, single: bool = False) -> list[tuple[str, dict]]:
    """jobs.submission.prepare, with its errors as a 422 problem."""
    try:
        return submission.prepare(job, state().settings, single)
    except submission.Invalid as exc:
        raise invalid(exc.errors, exc.status, exc.title) from None


def store_and_enqueue(job_in: JobCreate, key: str | None, prepared: list[tuple[str, dict]]) -> tuple[Job, bool]:
    """Create the caller's job (or find the one this Idempotency-Key made) and queue its items.
    Returns (job, replayed)."""
    s = state()
    try:
        return submission.submit(s.Session, s.celery, s.settings, job_in, prepared, api_key_id=auth.key_id(),
                                 idempotency_key=key, max_active_items=s.settings.max_queued_items_per_key)
    except submission.IdempotencyConflict as exc:
        raise ApiError(409, "Idempotency-Key reused", str(exc), job_id=str(exc.job_id)) from None
    except submission.QuotaExceeded as exc:
        raise ApiError(429, "Too many queued items", str(exc),
                       headers={"Retry-After": str(s.settings.quota_retry_after_s)}) from None
    except submission.BrokerDown as exc:
        raise ApiError(503, "Broker unavailable",
                       f"the job is stored but its items could not be queued ({exc}); they are sent when the "
                       "broker is back (beat retries every minute) or when this request is repeated with the same "
                       "Idempotency-Key", job_id=str(exc.job_id)) from None


# ------------------------------------------------------------------------------------------ presentation
def job_stats(job: Job) -> dict:
    tau = job.accepted_tokens / job.rounds if job.rounds else None
    tps = job.new_tokens / job.decode_time_s if job.decode_time_s > 0 else None
    sample_tps = base_tps = speedup = kind = None
    if job.sample_items and job.sample_decode_time_s > 0 and job.baseline_decode_time_s > 0:
        sample_tps = job.sample_new_tokens / job.sample_decode_time_s
        base_tps = job.baseline_new_tokens / job.baseline_decode_time_s
        if base_tps > 0:
            speedup, kind = sample_tps / base_tps, "measured"
    elif tps and job.target_forwards:
        # Vanilla decoding needs one target forward per new token; speculation needed target_forwards.
        speedup = job.new_tokens / job.target_forwards
        base_tps, kind = tps / speedup, "estimated"
    return {"new_tokens": job.new_tokens, "target_forwards": job.target_forwards, "mean_accept_length": tau,
            "tokens_per_s": tps, "decode_time_s": job.decode_time_s, "baseline_tokens_per_s": base_tps,
            "speedup": speedup, "speedup_kind": kind, "baseline_sample_items": job.sample_items,
            "sample_tokens_per_s": sample_tps}


def job_out(job: Job) -> dict:
    done = job.completed_items + job.failed_items + job.cancelled_items
    return JobOut(
        id=str(job.id), type=job.type, status=job.status, priority=job.priority,
        params={k: job.params[k] for k in PARAM_ORDER if k in job.params},  # JSONB does not keep key order
        metadata=job.metadata_, **kinds.get(job.type).shown(job.options or {}),
        progress=done / job.total_items if job.total_items else 1.0,
        item_counts={"total": job.total_items, "completed": job.completed_items, "failed": job.failed_items,
                     "cancelled": job.cancelled_items},
        created_at=job.created_at, started_at=job.started_at, cancel_requested_at=job.cancel_requested_at,
        finished_at=job.finished_at, stats=job_stats(job),
    ).model_dump(mode="json")


def result_out(item: Item, result: ItemResult) -> dict:
    return ResultOut(custom_id=item.custom_id, index=item.idx, status=item.status, output=result.output,
                     error={"message": result.error} if result.error is not None else None, stats=result.stats,
                     baseline_stats=result.baseline_stats).model_dump(mode="json")


def get_job(session, job_id: str) -> Job:
    """The caller's job; another key's job is 404, exactly like a job that does not exist."""
    try:
        job = session.get(Job, uuid.UUID(job_id))
    except ValueError:
        job = None
    if job is None or job.api_key_id != auth.key_id():
        raise ApiError(404, "Not Found", f"no job {job_id!r}")
    return job


def accepted(job: Job, replayed: bool):
    response = jsonify(job_out(job))
    response.status_code = 202
    response.headers["Location"] = url_for(".get_job_view", job_id=str(job.id))
    if replayed:
        response.headers["Idempotent-Replayed"] = "true"
    return response


# ------------------------------------------------------------------------------------------------ routes
@bp.post("/v1/jobs")
def create_job():
    key = idempotency_key()
    job_in = read_submission()
    return accepted(*store_and_enqueue(job_in, key, check_items(job_in)))


@bp.get("/v1/jobs/<job_id>")
def get_job_view(job_id: str):
    with state().Session() as session:
        return job_out(get_job(session, job_id))


def encode_cursor(job: Job) -> str:
    raw = json.dumps([job.created_at.isoformat(), str(job.id)]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, uuid.UUID]:
    """The cursor encode_cursor made; anything else (any JSON at all, nested however deep) is a 422."""
    try:
        decoded = parse_json(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        if not (isinstance(decoded, list) and len(decoded) == 2 and all(isinstance(v, str) for v in decoded)):
            raise ValueError("not a pair of strings")
        return datetime.fromisoformat(decoded[0]), uuid.UUID(decoded[1])
    except ValueError:  # binascii.Error and UnicodeDecodeError are ValueErrors too
        raise invalid([{"field": "after", "message": "not a cursor this API returned", "type": "value_error"}]) \
            from None


@bp.get("/v1/jobs")
def list_jobs():
    query = validate(ListJobsQuery, request.args.to_dict())
    statement = select(Job).where(Job.api_key_id == auth.key_id()) \
        .order_by(Job.created_at.desc(), Job.id.desc()).limit(query.limit + 1)
    if query.status:
        statement = statement.where(Job.status.in_(query.status.split(",")))
    if query.after:
        statement = statement.where(tuple_(Job.created_at, Job.id) < decode_cursor(query.after))
    with state().Session() as session:
        jobs = session.scalars(statement).all()
    page = jobs[:query.limit]
    has_more = len(jobs) > query.limit
    return JobList(data=[job_out(j) for j in page], has_more=has_more,
                   next_cursor=encode_cursor(page[-1]) if has_more else None).model_dump(mode="json")


def results_page(session, job_id, after: int, limit: int):
    return session.execute(select(Item, ItemResult).join(ItemResult)
                           .where(Item.job_id == job_id, Item.idx > after).order_by(Item.idx).limit(limit)).all()


@bp.get("/v1/jobs/<job_id>/results")
def job_results(job_id: str):
    """Finished items (completed, failed, cancelled) in input order; `?format=jsonl` streams all of them."""
    query = validate(ResultsQuery, request.args.to_dict())
    Session = state().Session
    with Session() as session:
        job = get_job(session, job_id)
        if query.format == "json":
            rows = results_page(session, job.id, query.after if query.after is not None else -1, query.limit + 1)
            page, has_more = rows[:query.limit], len(rows) > query.limit
            return ResultList(data=[result_out(*row) for row in page], has_more=has_more,
                              next_cursor=page[-1][0].idx if has_more else None).model_dump(mode="json")

    def lines(after=-1 if query.after is None else query.after, chunk=500):
        while True:
            with Session() as session:
                rows = results_page(session, job.id, after, chunk)
            for row in rows:
                yield json.dumps(result_out(*row)) + "\n"
            if len(rows) < chunk:
                return
            after = rows[-1][0].idx

    return Response(lines(), mimetype="application/x-ndjson")


@bp.post("/v1/jobs/<job_id>/cancel")
def cancel_job(job_id: str):
    with state().Session() as session:
        job = get_job(session, job_id)
        try:
            job = lifecycle.cancel(session, job.id)
        except lifecycle.Conflict as exc:
            raise ApiError(409, "Conflict", str(exc)) from None
        session.commit()
        return job_out(job)


def submit_one(item: ItemIn, source: str, stream: bool = False) -> Job:
    """One item as a job of its own at top priority, through the same queue as every job. `stream`: the worker
    streams its tokens (jobs/streaming.py); a hidden item param, not part of the native API."""
    job_in = JobCreate(type="generation", priority=MAX_PRIORITY, metadata={"source": source}, items=[item])
    prepared = check_items(job_in, single=True)
    if stream:
        prepared = [(custom_id, {**params, "stream": True}) for custom_id, params in prepared]
    return store_and_enqueue(job_in, None, prepared)[0]


def item_result(job: Job, s=None) -> ItemResult | None:
    """`s`: the app's State, for callers outside the request context (a streaming response)."""
    with (s or state()).Session() as session:
        return session.scalar(select(ItemResult).join(Item).where(Item.job_id == job.id))


def run_one(item: ItemIn, source: str) -> tuple[Job, ItemResult]:
    """submit_one, then wait up to GENERATE_TIMEOUT_S for its result (a failed item's result carries the error).
    Used by /generate and the OpenAI-compatible sync routes."""
    job = submit_one(item, source)
    deadline, pause = time.monotonic() + state().settings.generate_timeout_s, 0.02
    while (result := item_result(job)) is None:
        if time.monotonic() > deadline:
            raise ApiError(504, "Timeout", f"no result within {state().settings.generate_timeout_s:g} s; the "
                           "job continues: poll GET /v1/jobs/{job_id}", job_id=str(job.id))
        time.sleep(pause)
        pause = min(pause * 1.5, 0.25)
    return job, result


@bp.post("/generate")
def generate():
    """One prompt through the same queue at top priority; waits up to GENERATE_TIMEOUT_S for the result."""
    body = validate(GenerateRequest, json_body())
    job, result = run_one(ItemIn(**body.model_dump()), "generate")
    if result.error is not None:
        raise ApiError(502, "Generation failed", result.error, job_id=str(job.id))
    return GenerateOut(text=result.output["text"], token_ids=result.output["token_ids"],
                       stats=result.stats, job_id=str(job.id)).model_dump(mode="json")

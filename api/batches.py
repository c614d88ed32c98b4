"""OpenAI-compatible /v1/batches: create from an uploaded input file, get, list, cancel. A batch runs as a job
(GET /v1/jobs/{job_id} shows it too); its state is read from that job (jobs/batches.py). Another key's batch is
404."""
from __future__ import annotations

from flask import Blueprint, request
from sqlalchemy import select

from jobs import batches, files, lifecycle, submission
from jobs.models import Batch, File
from jobs.openai_spec import BatchCreate, BatchListQuery

from . import auth
from .errors import ApiError
from .files import keyset_page, live
from .views import json_body, state, validate

bp = Blueprint("batches", __name__)


def get_batch(session, batch_id: str) -> Batch:
    batch = session.get(Batch, batch_id)
    if batch is None or batch.api_key_id != auth.key_id():
        raise ApiError(404, "Not Found", f"No such Batch object: {batch_id}")
    return batch


def present(session, batch: Batch) -> dict:
    """The batch brought up to date (expiry, output files) and committed, as OpenAI's batch object."""
    job = batches.refresh(session, batch, state().settings)
    body = batches.batch_object(session, batch, job)
    session.commit()
    return body


def no_input_file(file_id: str) -> ApiError:
    return ApiError(400, "Bad Request", f"no batch input file {file_id!r}",
                    errors=[{"field": "input_file_id", "type": "invalid_file"}])


@bp.post("/v1/batches")
def create_batch():
    body = validate(BatchCreate, json_body())
    s = state()
    with s.Session() as session:
        # A missing file (or another key's) is a bad parameter of this request: 400, not 404.
        input_file = session.scalar(live(select(File).where(File.id == body.input_file_id, File.purpose == "batch")))
        if input_file is None:
            raise no_input_file(body.input_file_id)
        session.expunge(input_file)
    try:
        batch_id = batches.create(s.Session, s.celery, s.settings, auth.key_id(), input_file, body.endpoint,
                                  body.metadata)
    except files.Gone:  # its bytes were deleted meanwhile (retention)
        raise no_input_file(body.input_file_id) from None
    except submission.QuotaExceeded as exc:
        raise ApiError(429, "Too many queued items", str(exc),
                       headers={"Retry-After": str(s.settings.quota_retry_after_s)}) from None
    with s.Session() as session:
        return present(session, get_batch(session, batch_id))


@bp.get("/v1/batches/<batch_id>")
def retrieve_batch(batch_id: str):
    with state().Session() as session:
        return present(session, get_batch(session, batch_id))


@bp.get("/v1/batches")
def list_batches():
    query = validate(BatchListQuery, request.args.to_dict())
    with state().Session() as session:
        page = keyset_page(session, Batch, select(Batch).where(Batch.api_key_id == auth.key_id()), query)
        return {**page, "data": [present(session, batch) for batch in page["data"]]}


@bp.post("/v1/batches/<batch_id>/cancel")
def cancel_batch(batch_id: str):
    with state().Session() as session:
        batch = get_batch(session, batch_id)
        try:
            batches.cancel(session, batch, state().settings)
        except lifecycle.Conflict as exc:
            raise ApiError(409, "Conflict", str(exc)) from None
        return present(session, batch)

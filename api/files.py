"""OpenAI-compatible /v1/files: batch input files uploaded by the caller, and the output and error files of its
batches. Stored in Postgres or FILES_DIR, visible to the key that owns them only (another key's file is 404), and
gone once expired (retention: jobs/files.py)."""
from __future__ import annotations

from flask import Blueprint, Response, request
from sqlalchemy import select, tuple_

from jobs import files
from jobs.batches import new_id, ts
from jobs.models import File
from jobs.openai_spec import FileListQuery

from . import auth
from .errors import ApiError, invalid
from .views import state, validate

bp = Blueprint("files", __name__)


def file_object(file: File) -> dict:
    return {"id": file.id, "object": "file", "bytes": file.bytes, "created_at": ts(file.created_at),
            "filename": file.filename, "purpose": file.purpose, "expires_at": ts(file.expires_at),
            "status": "processed"}


def live(statement):
    """The caller's files that have not passed their retention (jobs/files.py)."""
    return statement.where(File.api_key_id == auth.key_id(), files.live())


def get_file(session, file_id: str) -> File:
    file = session.scalar(live(select(File).where(File.id == file_id)))
    if file is None:
        raise ApiError(404, "Not Found", f"No such File object: {file_id}")
    return file


def keyset_page(session, model, statement, query, descending: bool = True) -> dict:
    """A page of `statement` (the caller's rows of `model`) ordered by (created_at, id), after the row whose id is
    `query.after`: OpenAI's cursor list {object, data, first_id, last_id, has_more}."""
    order = (model.created_at.desc(), model.id.desc()) if descending else (model.created_at, model.id)
    if query.after:
        cursor = session.execute(select(model.created_at, model.id).where(
            model.id == query.after, model.api_key_id == auth.key_id())).first()
        if cursor is None:
            raise invalid([{"field": "after", "message": "not an id of this list", "type": "value_error"}])
        key = tuple_(model.created_at, model.id)
        statement = statement.where(key < tuple(cursor) if descending else key > tuple(cursor))
    rows = session.scalars(statement.order_by(*order).limit(query.limit + 1)).all()
    page = rows[:query.limit]
    return {"object": "list", "data": page, "first_id": page[0].id if page else None,
            "last_id": page[-1].id if page else None, "has_more": len(rows) > query.limit}


def storable_name(filename: str | None) -> str:
    """The upload's file name as Postgres can store it (no NUL, no lone surrogate), at most 256 characters."""
    name = (filename or "input.jsonl").replace("\x00", "").encode("utf-8", "replace").decode()
    return name[:256] or "input.jsonl"


def content_of(file: File) -> bytes:
    try:
        return files.read(state().settings, file)
    except files.Gone:
        raise ApiError(404, "Not Found", f"The content of {file.id} is no longer stored") from None


@bp.post("/v1/files")
def upload_file():
    upload = request.files.get("file") if request.mimetype == "multipart/form-data" else None
    if upload is None:
        raise invalid([{"field": "file", "message": "a multipart/form-data part named 'file' is required",
                        "type": "missing"}], 400)
    if request.form.get("purpose") != "batch":
        raise invalid([{"field": "purpose", "message": "only purpose=batch can be uploaded here",
                        "type": "value_error"}], 400)
    settings = state().settings
    file = File(id=new_id("file-"), api_key_id=auth.key_id(), purpose="batch", filename=storable_name(upload.filename),
                expires_at=files.input_expiry(settings))
    files.store(settings, file, upload.read())
    with state().Session() as session:
        session.add(file)
        session.commit()
        return file_object(file)


@bp.get("/v1/files")
def list_files():
    query = validate(FileListQuery, request.args.to_dict())
    with state().Session() as session:
        files.sweep(session, state().settings, auth.key_id())
        statement = live(select(File))
        if query.purpose:
            statement = statement.where(File.purpose == query.purpose)
        page = keyset_page(session, File, statement, query, descending=query.order == "desc")
        return {**page, "data": [file_object(f) for f in page["data"]]}


@bp.get("/v1/files/<file_id>")
def retrieve_file(file_id: str):
    with state().Session() as session:
        return file_object(get_file(session, file_id))


@bp.get("/v1/files/<file_id>/content")
def file_content(file_id: str):
    with state().Session() as session:
        file = get_file(session, file_id)
        return Response(content_of(file), mimetype="application/octet-stream",
                        headers={"Content-Disposition": f'attachment; filename="{file.id}.jsonl"'})


@bp.delete("/v1/files/<file_id>")
def delete_file(file_id: str):
    with state().Session() as session:
        files.delete_file(session, state().settings, get_file(session, file_id))
    return {"id": file_id, "object": "file", "deleted": True}

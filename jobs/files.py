"""Where the bytes of /v1/files live, and their retention.

A file's row (id, owner, size, expiry) is always in Postgres. Its bytes are in the row (`files.content`), or, when
FILES_DIR is set, in FILES_DIR/<file id> with `content` NULL; the row says which, so files written before FILES_DIR
was set (or changed) stay readable from Postgres. FILES_DIR must be the same directory for the API and the worker
(beat's sweep deletes from it).

Retention: an input file expires INPUT_FILE_RETENTION_S after upload, an output or error file OUTPUT_RETENTION
after it was written (`expires_at`, as OpenAI's file object has it). An expired file is gone for its owner at once,
except while a batch that is still running reads it as its input; `sweep` deletes expired files (on GET /v1/files
for the caller's, and from beat for all of them).
"""
from __future__ import annotations

import logging
import os
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

from sqlalchemy import and_, delete, exists, func, or_, select
from sqlalchemy.orm import Session

from .config import Settings
from .lifecycle import JOB_FINAL
from .models import Batch, File, Job

log = logging.getLogger(__name__)
ORPHAN_AGE_S = 3600  # a file in FILES_DIR without a row this long is left over from a failed upload


class Gone(Exception):
    """The file's row exists but its bytes do not (FILES_DIR lost it, or a sweep removed it meanwhile)."""


def path_of(settings: Settings, file_id: str) -> Path:
    return Path(settings.files_dir) / file_id


def input_expiry(settings: Settings) -> datetime | None:
    """expires_at of an input file uploaded now (None: kept until deleted)."""
    if settings.input_file_retention_s <= 0:
        return None
    return datetime.now(timezone.utc) + timedelta(seconds=settings.input_file_retention_s)


def store(settings: Settings, file: File, content: bytes) -> None:
    """Put the bytes where the settings say: in the row, or written to FILES_DIR before the row is committed (a
    crash in between leaves an orphan that `sweep` removes, never a row without bytes)."""
    file.bytes = len(content)
    if not settings.files_dir:
        file.content = content
        return
    final = path_of(settings, file.id)
    partial = final.with_name(final.name + ".partial")
    partial.write_bytes(content)
    os.replace(partial, final)  # atomic: a reader never sees half a file
    file.content = None


def read(settings: Settings, file: File) -> bytes:
    if file.content is not None:
        return file.content
    if not settings.files_dir:  # kept in a directory this server is no longer configured with
        raise Gone(file.id)
    try:
        return path_of(settings, file.id).read_bytes()
    except FileNotFoundError:
        raise Gone(file.id) from None


def in_use():
    """The file is the input of a batch whose job still runs."""
    return exists().where(Batch.input_file_id == File.id, Batch.job_id == Job.id, Job.status.notin_(JOB_FINAL))


def expired():
    return and_(File.expires_at <= func.now(), ~in_use())


def live():
    """The rows that are still files (what readers may see)."""
    return or_(File.expires_at.is_(None), ~expired())


def remove(settings: Settings, rows) -> None:
    """Unlink the bytes of deleted rows (id, content_is_null), after their deletion is committed."""
    for file_id, in_dir in rows:
        if in_dir and settings.files_dir:
            path_of(settings, file_id).unlink(missing_ok=True)


def delete_file(session: Session, settings: Settings, file: File) -> None:
    """Delete one file (row and bytes); commits."""
    row = (file.id, file.content is None)
    session.delete(file)
    session.commit()
    remove(settings, [row])


def sweep(session: Session, settings: Settings, api_key_id: int | None = None) -> int:
    """Delete the expired files (of one key, or all) and, for all, FILES_DIR's orphans; commits. Returns the files
    deleted."""
    statement = delete(File).where(expired())
    if api_key_id is not None:
        statement = statement.where(File.api_key_id == api_key_id)
    rows = session.execute(statement.returning(File.id, File.content.is_(None))).all()
    session.commit()
    remove(settings, rows)
    if api_key_id is None and settings.files_dir:
        remove_orphans(session, settings)
    return len(rows)


def remove_orphans(session: Session, settings: Settings) -> None:
    """Files in FILES_DIR with no row, older than ORPHAN_AGE_S (younger ones may be uploads not yet committed)."""
    cutoff = time.time() - ORPHAN_AGE_S
    old = {p.name.removesuffix(".partial"): p for p in Path(settings.files_dir).iterdir()
           if p.is_file() and p.stat().st_mtime < cutoff}
    if not old:
        return
    known = set(session.scalars(select(File.id).where(File.id.in_(list(old)))))
    for file_id, path in old.items():
        if file_id not in known or path.name.endswith(".partial"):
            log.info("removing %s: no file row refers to it", path)
            path.unlink(missing_ok=True)

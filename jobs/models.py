"""The SQLAlchemy models: the one place the schema is described (Alembic migrations follow it)."""
from __future__ import annotations

import builtins
import uuid
from datetime import datetime

from sqlalchemy import (BigInteger, Boolean, CheckConstraint, DateTime, Double, ForeignKey, Index, Integer,
                        LargeBinary, MetaData, String, Text, UniqueConstraint, func)
from sqlalchemy.dialects.postgresql import JSONB, UUID
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from .kinds import KINDS

JOB_TYPES = tuple(KINDS)  # the registered job kinds (jobs/kinds.py)
JOB_STATUSES = ("queued", "running", "completed", "failed", "cancelling", "cancelled")
ITEM_STATUSES = ("queued", "running", "completed", "failed", "cancelled")
NULLABLE_JSON = JSONB(none_as_null=True)  # Python None -> SQL NULL, not JSON null


def _in(column: str, values) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    })


class ApiKey(Base):
    """An API key. Only its sha256 is stored (keys are 32 random bytes, so a fast hash is enough: there is nothing to
    brute-force), plus a short prefix to tell keys apart in listings. Revoked keys stay, so their jobs keep an owner."""
    __tablename__ = "api_keys"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(128))
    prefix: Mapped[str] = mapped_column(String(16))  # "e3k_" + the first 8 characters: safe to display
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)  # sha256 hex of the whole key
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class Job(Base):
    __tablename__ = "jobs"

    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True, default=uuid.uuid4)
    # The key that submitted the job (its schedule's key for a scheduled run). NULL: a job from before API keys
    # existed, which no key can see.
    api_key_id: Mapped[int | None] = mapped_column(ForeignKey("api_keys.id"))
    schedule_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("schedules.id", ondelete="SET NULL"))
    type: Mapped[str] = mapped_column(String(16))
    status: Mapped[str] = mapped_column(String(16), default="queued")
    priority: Mapped[int] = mapped_column(Integer, default=5)
    params: Mapped[dict] = mapped_column(JSONB, default=dict)  # job-level decode params (items may override)
    metadata_: Mapped[dict] = mapped_column("metadata", JSONB, default=dict)
    # The kind's own job fields (jobs/kinds.py), e.g. a review job's {labels, policy}; {} when none are set.
    options: Mapped[dict] = mapped_column(JSONB, default=dict, server_default="{}")
    idempotency_key: Mapped[str | None] = mapped_column(String(255))  # unique per key (see __table_args__)
    request_hash: Mapped[str | None] = mapped_column(String(64))

    total_items: Mapped[int] = mapped_column(Integer)
    completed_items: Mapped[int] = mapped_column(Integer, default=0)
    failed_items: Mapped[int] = mapped_column(Integer, default=0)
    cancelled_items: Mapped[int] = mapped_column(Integer, default=0)

    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    cancel_requested_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))

    # Speedup stats, accumulated as item results are written (in the same transaction).
    # All items, speculative decoding:
    new_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    target_forwards: Mapped[int] = mapped_column(BigInteger, default=0)
    rounds: Mapped[int] = mapped_column(BigInteger, default=0)  # draft+verify rounds
    accepted_tokens: Mapped[int] = mapped_column(BigInteger, default=0)  # tokens those rounds emitted (tau = /rounds)
    decode_time_s: Mapped[float] = mapped_column(Double, default=0.0)  # each item's share of its batch's wall time
    # The baseline sample (measure_baseline=true): the same items decoded both ways, in the same batches.
    sample_items: Mapped[int] = mapped_column(Integer, default=0)
    sample_new_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    sample_decode_time_s: Mapped[float] = mapped_column(Double, default=0.0)
    baseline_new_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    baseline_decode_time_s: Mapped[float] = mapped_column(Double, default=0.0)

    items: Mapped[list[Item]] = relationship(back_populates="job", passive_deletes=True)

    __table_args__ = (
        CheckConstraint(_in("type", JOB_TYPES), name="type"),
        CheckConstraint(_in("status", JOB_STATUSES), name="status"),
        Index(None, "api_key_id", "created_at", "id"),  # keyset pagination of GET /v1/jobs (per key)
        Index(None, "status"),
        # Idempotency keys are per API key: one key's choice can neither collide with nor reveal another's.
        UniqueConstraint("api_key_id", "idempotency_key"),
    )


class Item(Base):
    """One prompt of a job; the unit the queue carries (by id) and the worker claims."""
    __tablename__ = "items"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    job_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    idx: Mapped[int] = mapped_column(Integer)  # position in the job's input; results come back in this order
    custom_id: Mapped[str] = mapped_column(String(256))
    prompt: Mapped[str | None] = mapped_column(Text)  # a bare prompt (one user turn) ...
    messages: Mapped[list | None] = mapped_column(NULLABLE_JSON)  # ... or chat turns [{role, content}]
    params: Mapped[dict] = mapped_column(JSONB)  # effective decode params (job params + item overrides)
    baseline_sample: Mapped[bool] = mapped_column(Boolean, default=False)
    status: Mapped[str] = mapped_column(String(16), default="queued")
    attempts: Mapped[int] = mapped_column(Integer, default=0)  # deliveries claimed; capped by max_attempts
    enqueued_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))  # NULL: not yet on the broker
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # The worker that holds the item (its message prefetched, or the item being decoded) and until when; the worker
    # renews it while it holds the item. Expired: the worker is dead or stopped, and the reconciler re-sends the
    # item. Only the owner may write the item's result. NULL once the item is finished.
    lease_owner: Mapped[str | None] = mapped_column(String(128))
    lease_expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))

    job: Mapped[Job] = relationship(back_populates="items")
    result: Mapped[ItemResult | None] = relationship(back_populates="item", passive_deletes=True)

    __table_args__ = (
        CheckConstraint(_in("status", ITEM_STATUSES), name="status"),
        CheckConstraint("(prompt IS NULL) <> (messages IS NULL)", name="prompt_xor_messages"),
        UniqueConstraint("job_id", "idx"),
        UniqueConstraint("job_id", "custom_id"),
        Index(None, "status", "enqueued_at"),
        Index(None, "lease_expires_at"),
    )


class ItemResult(Base):
    """An item's outcome, written exactly once (primary key = item id), so a redelivered batch cannot duplicate it."""
    __tablename__ = "item_results"

    item_id: Mapped[int] = mapped_column(ForeignKey("items.id", ondelete="CASCADE"), primary_key=True)
    output: Mapped[dict | None] = mapped_column(NULLABLE_JSON)  # generation: {text, token_ids}; review: {label, score, ...}
    error: Mapped[str | None] = mapped_column(Text)
    stats: Mapped[dict | None] = mapped_column(NULLABLE_JSON)  # the decoder's per-item stats + batch info
    baseline_stats: Mapped[dict | None] = mapped_column(NULLABLE_JSON)  # same, vanilla decoding (baseline sample only)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())

    item: Mapped[Item] = relationship(back_populates="result")

    __table_args__ = (CheckConstraint("(output IS NULL) <> (error IS NULL)", name="output_xor_error"),)


class Schedule(Base):
    """A job that runs on a cron schedule (Celery beat's dispatcher, every minute, creates the due runs)."""
    __tablename__ = "schedules"

    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True, default=uuid.uuid4)
    api_key_id: Mapped[int] = mapped_column(ForeignKey("api_keys.id"))
    name: Mapped[str] = mapped_column(String(128))
    cron: Mapped[str] = mapped_column(String(128))  # 5-field cron expression (croniter), in `timezone`
    timezone: Mapped[str] = mapped_column(String(64), default="UTC")  # IANA name
    # The job template: {type, params, priority, metadata}, validated like a submission's job fields.
    template: Mapped[dict] = mapped_column(JSONB)
    # Where the items come from: {"kind": "inline", "items": [...]} or {"kind": "file", "path": "<relative path
    # under SCHEDULE_INPUT_DIR>"} (a JSONL file read at each run).
    source: Mapped[dict] = mapped_column(JSONB)
    enabled: Mapped[bool] = mapped_column(Boolean, default=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    # The due time the dispatcher last handled (only later due times are run); starts at creation.
    last_due_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))

    __table_args__ = (Index(None, "api_key_id", "created_at"),)


class ScheduleRun(Base):
    """One due time of a schedule. Unique (schedule_id, due_at): two dispatchers (two beats) cannot both run it."""
    __tablename__ = "schedule_runs"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    schedule_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("schedules.id", ondelete="CASCADE"))
    due_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    job_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("jobs.id", ondelete="SET NULL"))
    error: Mapped[str | None] = mapped_column(Text)  # why no job was created (e.g. the input file was invalid)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())

    __table_args__ = (UniqueConstraint("schedule_id", "due_at"),)


FILE_PURPOSES = ("batch", "batch_output")


class File(Base):
    """An uploaded batch input file, or a batch's output or error file (OpenAI's /v1/files). The row is in Postgres;
    the bytes are in it or in FILES_DIR (jobs/files.py)."""
    __tablename__ = "files"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)  # "file-<hex>"
    api_key_id: Mapped[int] = mapped_column(ForeignKey("api_keys.id"))
    purpose: Mapped[str] = mapped_column(String(32))
    filename: Mapped[str] = mapped_column(String(256))
    bytes: Mapped[int] = mapped_column(BigInteger)
    # NULL: the bytes are in FILES_DIR (jobs/files.py). builtins.bytes: the `bytes` column above shadows the name.
    content: Mapped[builtins.bytes | None] = mapped_column(LargeBinary)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))  # gone after this (retention)

    __table_args__ = (
        CheckConstraint(_in("purpose", FILE_PURPOSES), name="purpose"),
        Index(None, "api_key_id", "created_at", "id"),
        Index(None, "expires_at"),  # the retention sweep
    )


class Batch(Base):
    """An OpenAI-style batch: an input file validated into a job (one item per valid line). Its status, counts and
    timestamps are read from the job; only what the job cannot say is kept here: the lines that could not run, the
    expiry, and the output/error files written once the job is final."""
    __tablename__ = "batches"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)  # "batch_<hex>"
    api_key_id: Mapped[int] = mapped_column(ForeignKey("api_keys.id"))
    job_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("jobs.id", ondelete="SET NULL"))  # NULL: failed
    endpoint: Mapped[str] = mapped_column(String(64))
    model: Mapped[str | None] = mapped_column(String(256))
    input_file_id: Mapped[str] = mapped_column(String(64))  # not a foreign key: the input file may be deleted
    completion_window: Mapped[str] = mapped_column(String(8))
    metadata_: Mapped[dict | None] = mapped_column("metadata", NULLABLE_JSON)
    total_requests: Mapped[int] = mapped_column(Integer)  # non-blank input lines
    # Lines that did not become items: [{line, custom_id, code, message, param}] (they go to the error file).
    line_errors: Mapped[list] = mapped_column(JSONB, default=list)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    failed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))  # validation failed: no job
    expired_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finalized_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))  # output files written
    output_file_id: Mapped[str | None] = mapped_column(String(64))
    error_file_id: Mapped[str | None] = mapped_column(String(64))

    __table_args__ = (Index(None, "api_key_id", "created_at", "id"),
                      Index(None, "input_file_id"))  # the retention sweep: is an expired file still read?

"""Request and response models. The same pydantic models validate requests and generate the OpenAPI spec."""
from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator

from jobs.models import JOB_STATUSES
# The submission models live in jobs/ (the scheduler validates with them too); re-exported for the views and spec.
from jobs.spec import (DEFAULT_PARAMS, DecodeOverrides, ItemIn, JobCreate, JobOptions, JobParams,  # noqa: F401
                       INT32_MAX, JobType, ScheduleCreate, ScheduleUpdate, Strict, Text)

JobStatus = Literal[JOB_STATUSES]  # type: ignore[valid-type]
ItemStatus = Literal["completed", "failed", "cancelled"]


class GenerateRequest(DecodeOverrides):
    prompt: Text = Field(min_length=1)


class ListJobsQuery(Strict):
    status: str | None = Field(None, description="Comma-separated statuses to keep.")
    limit: int = Field(20, ge=1, le=100)
    after: str | None = Field(None, description="`next_cursor` of the previous page.")

    @field_validator("status")
    @classmethod
    def _statuses(cls, value: str | None) -> str | None:
        if value is not None:
            unknown = [s for s in value.split(",") if s not in JOB_STATUSES]
            if unknown:
                raise ValueError(f"unknown status {unknown[0]!r}; one of {', '.join(JOB_STATUSES)}")
        return value


class ResultsQuery(Strict):
    format: Literal["json", "jsonl"] = "json"
    limit: int = Field(100, ge=1, le=1000)
    after: int | None = Field(None, ge=-1, le=INT32_MAX, description="`next_cursor` of the previous page.")


# ------------------------------------------------------------------------------------------------- responses
class ItemCounts(BaseModel):
    total: int
    completed: int
    failed: int
    cancelled: int


class JobStats(BaseModel):
    """Speculative-decoding stats over the job's finished items."""
    new_tokens: int
    target_forwards: int = Field(description="Target forward passes (prefill + verify steps) summed over items.")
    mean_accept_length: float | None = Field(description="tau: tokens emitted per draft/verify round.")
    tokens_per_s: float | None = Field(description="New tokens / the items' share of their batches' wall time.")
    decode_time_s: float
    baseline_tokens_per_s: float | None = Field(description="Vanilla decoding on the same engine.")
    speedup: float | None
    speedup_kind: Literal["measured", "estimated"] | None = Field(
        description="measured: the baseline sample was decoded both ways in identical batches and the two "
                    "throughputs compared. estimated: no baseline was run; speedup = new_tokens / target_forwards "
                    "(vanilla needs one forward per token), an upper bound: it assumes drafting is free and a "
                    "verify forward costs what a vanilla one does.")
    baseline_sample_items: int
    sample_tokens_per_s: float | None = Field(description="Speculative throughput on the baseline sample alone.")


class JobOut(BaseModel):
    id: str
    object: Literal["job"] = "job"
    type: JobType
    status: JobStatus
    priority: int
    params: dict[str, Any]
    metadata: dict[str, str]
    labels: list[str] | None = Field(None, description="review: the job's label set (default: the built-in "
                                                       "taxonomy); absent for other types.")
    policy: str | None = Field(None, description="review: the job's policy text, if it gave one.")
    item_counts: ItemCounts
    progress: float = Field(description="Finished items / total, 0..1.")
    created_at: datetime
    started_at: datetime | None
    cancel_requested_at: datetime | None
    finished_at: datetime | None
    stats: JobStats


class JobList(BaseModel):
    object: Literal["list"] = "list"
    data: list[JobOut]
    has_more: bool
    next_cursor: str | None


class ItemError(BaseModel):
    message: str


class ResultOut(BaseModel):
    custom_id: str
    index: int
    status: ItemStatus
    output: dict[str, Any] | None = Field(
        description="generation: {text, token_ids}; review: {label, score, rationale, label_scores} (label_scores: "
                    "one probability per label of the job's label set).")
    error: ItemError | None
    stats: dict[str, Any] | None = Field(description="Decoder stats of this item (speculative run).")
    baseline_stats: dict[str, Any] | None = Field(description="Vanilla run of the item, when it was in the sample.")


class ResultList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ResultOut]
    has_more: bool
    next_cursor: int | None


class GenerateOut(BaseModel):
    text: str
    token_ids: list[int]
    stats: dict[str, Any]
    job_id: str


class FieldError(BaseModel):
    field: str
    message: str
    type: str
    line: int | None = None


class Problem(BaseModel):
    """RFC 9457 problem details (application/problem+json)."""
    type: str = "about:blank"
    title: str
    status: int
    detail: str | None = None
    instance: str | None = None
    errors: list[FieldError] | None = None
    job_id: str | None = None


class HealthOut(BaseModel):
    status: Literal["ok", "unavailable"]
    checks: dict[str, dict[str, Any]]

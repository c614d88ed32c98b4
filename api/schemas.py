"""Request and response models. The same pydantic models validate requests and generate the OpenAPI spec."""
from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

from jobs.models import JOB_STATUSES, JOB_TYPES

JobType = Literal[JOB_TYPES]  # type: ignore[valid-type]
JobStatus = Literal[JOB_STATUSES]  # type: ignore[valid-type]
ItemStatus = Literal["completed", "failed", "cancelled"]



def _no_nul(value: str) -> str:
    if "\x00" in value:
        raise ValueError("must not contain NUL (U+0000) characters")
    return value


# A string Postgres can store: text and JSONB cannot hold NUL.
Text = Annotated[str, AfterValidator(_no_nul)]
# Item positions (items.idx) are 32-bit integers in Postgres.
INT32_MAX = 2**31 - 1

# Job-level defaults; an item may override any of them.
DEFAULT_PARAMS = {"max_new_tokens": 64, "temperature": 0.0, "top_p": 1.0, "top_k": 0,
                  "parallel_degree": 4, "validation_threshold": 1.0, "seed": None}


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt field is an error, not silently ignored


class DecodeOverrides(Strict):
    """Decoding parameters. Unset fields take the job's value, then the defaults."""
    max_new_tokens: int | None = Field(None, ge=1, description="Tokens to generate at most (default 64).")
    temperature: float | None = Field(None, ge=0.0, le=2.0, description="0 = greedy, deterministic (default).")
    top_p: float | None = Field(None, gt=0.0, le=1.0, description="Nucleus sampling mass (default 1.0).")
    top_k: int | None = Field(None, ge=0, le=1000, description="0 = no top-k filter (default).")
    parallel_degree: int | None = Field(None, ge=1, le=16, description="Draft tokens per tree level (default 4).")
    validation_threshold: float | None = Field(
        None, gt=0.0, le=1.0, description="Verification acceptance threshold; 1.0 = lossless (default).")
    seed: int | None = Field(None, ge=0, le=2**31 - 1, description="Sampling seed (temperature > 0).")


class JobParams(DecodeOverrides):
    measure_baseline: bool = Field(
        False, description="Also decode a sample of the items without speculation and store the measured speedup.")


class ItemIn(DecodeOverrides):
    custom_id: Text | None = Field(None, min_length=1, max_length=256,
                                  description="Your id, echoed in the results; unique within the job. "
                                              "Default: the item's position.")
    prompt: Text = Field(min_length=1, description="generation: the user message; review: the text to judge.")


class JobCreate(Strict):
    type: JobType = "generation"
    items: list[ItemIn] = Field(min_length=1)
    params: JobParams = Field(default_factory=JobParams)
    priority: int = Field(5, ge=0, le=9, description="9 is served first.")
    metadata: dict[str, str] = Field(default_factory=dict, description="Up to 16 keys (64 chars), values 512 chars.")

    @field_validator("metadata")
    @classmethod
    def _metadata_limits(cls, value: dict[str, str]) -> dict[str, str]:
        if len(value) > 16:
            raise ValueError("at most 16 keys")
        for key, item in value.items():
            if len(key) > 64 or len(item) > 512:
                raise ValueError(f"key {key[:64]!r}: keys are at most 64 characters, values 512")
            if "\x00" in key or "\x00" in item:
                raise ValueError(f"key {key[:64]!r}: keys and values must not contain NUL (U+0000) characters")
        return value


class JobOptions(Strict):
    """The job fields of a JSONL upload (multipart field `job`); the items come from the file."""
    type: JobType = "generation"
    params: JobParams = Field(default_factory=JobParams)
    priority: int = Field(5, ge=0, le=9)
    metadata: dict[str, str] = Field(default_factory=dict)


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
        description="generation: {text, token_ids}; review: {label, score, rationale, label_scores}.")
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

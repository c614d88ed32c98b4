"""What a job submission is: the request models shared by the API (which validates submissions with them and
generates the OpenAPI spec from them) and the scheduler (which validates schedule templates and input files)."""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from .models import JOB_TYPES

JobType = Literal[JOB_TYPES]  # type: ignore[valid-type]


def _storable(value: str) -> str:
    """Postgres text and JSONB cannot hold NUL, and a lone surrogate (JSON allows "\\udfff") is not encodable as
    UTF-8 at all: reject both here, rather than fail when the value is hashed or stored."""
    if "\x00" in value:
        raise ValueError("must not contain NUL (U+0000) characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must not contain lone surrogates (U+D800 to U+DFFF): not valid Unicode text") from None
    return value


# A string Postgres can store. Every string field of a request is one.
Text = Annotated[str, AfterValidator(_storable)]


def _metadata_limits(value: dict[str, str]) -> dict[str, str]:
    if len(value) > 16:
        raise ValueError("at most 16 keys")
    for key, item in value.items():
        if len(key) > 64 or len(item) > 512:
            raise ValueError(f"key {key[:64]!r}: keys are at most 64 characters, values 512")
        try:
            _storable(key), _storable(item)
        except ValueError as exc:
            raise ValueError(f"key {key[:64]!r}: keys and values {exc}") from None
    return value


# Job metadata, the same for a submission and a schedule's job template.
Metadata = Annotated[dict[str, str], AfterValidator(_metadata_limits)]
# Item positions (items.idx) are 32-bit integers in Postgres.
INT32_MAX = 2**31 - 1

# Job-level defaults; an item may override any of them.
DEFAULT_PARAMS = {"max_new_tokens": 64, "temperature": 0.0, "top_p": 1.0, "top_k": 0,
                  "parallel_degree": 4, "validation_threshold": 1.0, "seed": None}


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt field is an error, not silently ignored


class Body(Strict):
    """A JSON request body: strict types, as the spec says ("0.5" is not a number, true is not an integer, "yes" is
    not a boolean). Query strings stay lax (Strict), since every query value arrives as a string."""
    model_config = ConfigDict(extra="forbid", strict=True)


class DecodeOverrides(Body):
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


class JobOptions(Body):
    """The job fields without the items: a JSONL upload's `job` part, a schedule's job template."""
    type: JobType = "generation"
    params: JobParams = Field(default_factory=JobParams)
    priority: int = Field(5, ge=0, le=9, description="9 is served first.")
    metadata: Metadata = Field(default_factory=dict, description="Up to 16 keys (64 chars), values 512 chars.")


class JobCreate(Body):
    # Field order matters: request_hash (the Idempotency-Key check) hashes the model's JSON dump.
    type: JobType = "generation"
    items: list[ItemIn] = Field(min_length=1)
    params: JobParams = Field(default_factory=JobParams)
    priority: int = Field(5, ge=0, le=9, description="9 is served first.")
    metadata: Metadata = Field(default_factory=dict, description="Up to 16 keys (64 chars), values 512 chars.")


# ------------------------------------------------------------------------------------------------ schedules
class InlineSource(Body):
    kind: Literal["inline"] = "inline"
    items: list[ItemIn] = Field(min_length=1)


class FileSource(Body):
    """A JSONL file (one ItemIn per line) under the server's SCHEDULE_INPUT_DIR, read at every run."""
    kind: Literal["file"]
    path: Text = Field(min_length=1, max_length=1024, description="Relative to SCHEDULE_INPUT_DIR.")


class ScheduleCreate(Body):
    name: Text = Field(min_length=1, max_length=128)
    cron: Text = Field("0 2 * * *", min_length=1, max_length=128, examples=["0 2 * * *"],
                      description="5-field cron expression (minute hour day month weekday), in `timezone`. "
                                  "Default: nightly at 02:00.")
    timezone: Text = Field("UTC", min_length=1, max_length=64, description="IANA name, e.g. Europe/Berlin.")
    job: JobOptions = Field(default_factory=JobOptions, description="The job each run creates (items aside).")
    source: InlineSource | FileSource = Field(discriminator="kind")
    enabled: bool = True


class ScheduleUpdate(Body):
    """PATCH: the fields to change."""
    name: Text | None = Field(None, min_length=1, max_length=128)
    cron: Text | None = Field(None, min_length=1, max_length=128)
    timezone: Text | None = Field(None, min_length=1, max_length=64)
    job: JobOptions | None = None
    source: InlineSource | FileSource | None = Field(None, discriminator="kind")
    enabled: bool | None = None

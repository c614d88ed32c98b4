"""What a job submission is: the request models shared by the API (which validates submissions with them and
generates the OpenAPI spec from them) and the scheduler (which validates schedule templates and input files)."""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import InitErrorDetails

from .models import JOB_TYPES

JobType = Literal[JOB_TYPES]  # type: ignore[valid-type]


def check_text(value: str) -> str:
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
Text = Annotated[str, AfterValidator(check_text)]
Stop = Annotated[Text, Field(min_length=1, max_length=256)]


def metadata_limits(value: dict[str, str] | None) -> dict[str, str] | None:
    """OpenAI's metadata limits (16 keys of 64 characters, values of 512), and storable text."""
    if value is None:
        return value
    if len(value) > 16:
        raise ValueError("at most 16 keys")
    for key, item in value.items():
        if len(key) > 64 or len(item) > 512:
            raise ValueError(f"key {key[:64]!r}: keys are at most 64 characters, values 512")
        try:
            check_text(key), check_text(item)
        except ValueError as exc:
            raise ValueError(f"key {key[:64]!r}: keys and values {exc}") from None
    return value


# Job metadata, the same for a submission and a schedule's job template.
Metadata = Annotated[dict[str, str], AfterValidator(metadata_limits)]
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
    max_tokens: int | None = Field(None, ge=1, description="OpenAI's name for max_new_tokens (give one of them).")
    stop: Stop | list[Stop] | None = Field(
        None, description="Up to 4 strings: the text ends before the first one that appears (finish_reason stop). "
                          "Applied to the decoded text after decoding.")

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, value):
        value = [value] if isinstance(value, str) else value
        if value is not None and not 1 <= len(value) <= 4:
            raise ValueError("1 to 4 stop strings")
        return value

    @model_validator(mode="after")
    def _max_tokens_alias(self):
        return self.fold_into_max_new_tokens("max_tokens")

    def fold_into_max_new_tokens(self, alias: str):
        """Another name of the token limit: moved into max_new_tokens (a different value in both is an error)."""
        value = getattr(self, alias)
        if value is not None:
            if self.max_new_tokens is not None and self.max_new_tokens != value:
                raise ValueError(f"{alias} and max_new_tokens are one limit: give one of them")
            self.max_new_tokens = value
            setattr(self, alias, None)
        return self


class JobParams(DecodeOverrides):
    measure_baseline: bool = Field(
        False, description="Also decode a sample of the items without speculation and store the measured speedup.")


class TextPart(Strict):
    type: Literal["text"]
    text: Text


class Message(Strict):
    """A chat turn. `content` may also be OpenAI's list of text parts (joined)."""
    role: Literal["system", "developer", "user", "assistant"]
    content: Text | list[TextPart]
    name: str | None = Field(None, max_length=64, description="Accepted for compatibility; not shown to the model.")

    def turn(self) -> dict:
        """{role, content} as chat templates take it: OpenAI's `developer` is the system turn."""
        text = self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)
        return {"role": "system" if self.role == "developer" else self.role, "content": text}


class ItemIn(DecodeOverrides):
    custom_id: Text | None = Field(None, min_length=1, max_length=256,
                                  description="Your id, echoed in the results; unique within the job. "
                                              "Default: the item's position.")
    prompt: Text | None = Field(None, min_length=1,
                                description="generation: the user message; review: the text to judge. "
                                            "Give `prompt` or `messages`.")
    messages: list[Message] | None = Field(
        None, min_length=1, max_length=256,
        description="generation: system/user/assistant turns, the model's chat template applied.")

    @model_validator(mode="before")
    @classmethod
    def _prompt_required(cls, data):
        """Neither given: `prompt` is the missing field (what a client most likely meant to send)."""
        if isinstance(data, dict) and data.get("prompt") is None and data.get("messages") is None:
            raise ValidationError.from_exception_data(cls.__name__, [
                InitErrorDetails(type="missing", loc=("prompt",), input=data)])
        return data

    @model_validator(mode="after")
    def _not_both(self):
        if self.prompt is not None and self.messages is not None:
            raise ValueError("give either prompt or messages, not both")
        return self

    def turns(self) -> list[dict] | None:
        """The messages as plain {role, content} dicts (what is stored and templated), or None for a prompt."""
        return None if self.messages is None else [m.turn() for m in self.messages]


MAX_LABELS, MAX_LABEL_CHARS, MAX_POLICY_CHARS = 32, 64, 4000


def check_label(value: str) -> str:
    """A label is one line of the prompt's category list and is scored as the start of the model's reply: no
    surrounding blanks, no line breaks."""
    if value != value.strip() or "\n" in value or "\r" in value:
        raise ValueError("no leading or trailing whitespace and no line breaks")
    return value


def unique_labels(value: list[str] | None) -> list[str] | None:
    """Labels differing only in case would be one category to the model."""
    if value is not None:
        folded = [label.casefold() for label in value]
        if len(set(folded)) != len(folded):
            raise ValueError("labels must be unique (case-insensitively)")
    return value


Label = Annotated[Text, Field(min_length=1, max_length=MAX_LABEL_CHARS), AfterValidator(check_label)]
Labels = Annotated[list[Label], Field(min_length=2, max_length=MAX_LABELS), AfterValidator(unique_labels)]
Policy = Annotated[Text, Field(min_length=1, max_length=MAX_POLICY_CHARS)]
LABELS_DOC = (f"review only: the job's label set (2 to {MAX_LABELS} unique strings of at most {MAX_LABEL_CHARS} "
              "characters). Default: the built-in taxonomy.")
POLICY_DOC = f"review only: the policy the texts are judged by (at most {MAX_POLICY_CHARS} characters)."


class JobOptions(Body):
    """The job fields without the items: a JSONL upload's `job` part, a schedule's job template."""
    type: JobType = "generation"
    params: JobParams = Field(default_factory=JobParams)
    priority: int = Field(5, ge=0, le=9, description="9 is served first.")
    metadata: Metadata = Field(default_factory=dict, description="Up to 16 keys (64 chars), values 512 chars.")
    labels: Labels | None = Field(None, description=LABELS_DOC)
    policy: Policy | None = Field(None, description=POLICY_DOC)


class JobCreate(Body):
    # Field order matters: request_hash (the Idempotency-Key check) hashes the model's JSON dump.
    type: JobType = "generation"
    items: list[ItemIn] = Field(min_length=1)
    params: JobParams = Field(default_factory=JobParams)
    priority: int = Field(5, ge=0, le=9, description="9 is served first.")
    metadata: Metadata = Field(default_factory=dict, description="Up to 16 keys (64 chars), values 512 chars.")
    labels: Labels | None = Field(None, description=LABELS_DOC)
    policy: Policy | None = Field(None, description=POLICY_DOC)


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

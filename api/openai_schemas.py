"""Response models of the OpenAI-compatible routes, for the OpenAPI spec (the bodies are built by
jobs/openai_format.py and jobs/batches.py; tests/test_api_schemathesis.py checks that they match these)."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field


class Eagle3Stats(BaseModel):
    """Extension field `eagle3` of every completion: this request's speculative-decoding stats."""
    accept_length: float | None = Field(description="tau: tokens emitted per draft/verify round.")
    tokens_per_s: float | None = Field(description="New tokens / the item's share of its batch's wall time.")
    speedup: float | None = Field(description="Over vanilla decoding; see speedup_kind.")
    speedup_kind: Literal["measured", "estimated"] | None
    new_tokens: int = Field(description="Tokens decoded (a stop string may have cut the answer shorter).")
    target_forwards: int | None
    speculative: bool | None
    decode_time_s: float


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class AssistantMessage(BaseModel):
    role: Literal["assistant"]
    content: str
    refusal: None = None


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: None = None
    finish_reason: Literal["stop", "length"]


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    eagle3: Eagle3Stats | None


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: None = None
    finish_reason: Literal["stop", "length"] | None


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    eagle3: Eagle3Stats | None = None


class Model(BaseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[Model]


class OpenAIErrorBody(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class OpenAIError(BaseModel):
    """The error shape of the OpenAI-compatible routes (an invalid field is 400 there, not 422)."""
    error: OpenAIErrorBody


class FileObject(BaseModel):
    id: str
    object: Literal["file"]
    bytes: int
    created_at: int
    filename: str
    purpose: Literal["batch", "batch_output"]
    expires_at: int | None = Field(None, description="When the file is deleted (INPUT_FILE_RETENTION_S after upload; "
                                                      "30 days for batch outputs); null: kept until deleted. An "
                                                      "expired input of a running batch is kept until it ends.")
    status: Literal["processed"] = "processed"


class FileList(BaseModel):
    object: Literal["list"]
    data: list[FileObject]
    first_id: str | None
    last_id: str | None
    has_more: bool


class FileDeleted(BaseModel):
    id: str
    object: Literal["file"]
    deleted: bool


class BatchError(BaseModel):
    code: str
    message: str
    param: str | None = None
    line: int | None = None


class BatchErrors(BaseModel):
    object: Literal["list"]
    data: list[BatchError]


class RequestCounts(BaseModel):
    total: int
    completed: int
    failed: int


class Batch(BaseModel):
    id: str
    object: Literal["batch"]
    endpoint: str
    model: str | None
    errors: BatchErrors | None
    input_file_id: str
    completion_window: str
    status: Literal["validating", "failed", "in_progress", "finalizing", "completed", "expired", "cancelling",
                    "cancelled"]
    output_file_id: str | None
    error_file_id: str | None
    created_at: int
    in_progress_at: int | None
    expires_at: int | None
    finalizing_at: int | None
    completed_at: int | None
    failed_at: int | None
    expired_at: int | None
    cancelling_at: int | None
    cancelled_at: int | None
    request_counts: RequestCounts
    usage: dict[str, Any] = Field(description="input_tokens, output_tokens, total_tokens and their details.")
    metadata: dict[str, str] | None
    job_id: str | None = Field(description="Extension: the native job (GET /v1/jobs/{id}) that runs the batch.")


class BatchList(BaseModel):
    object: Literal["list"]
    data: list[Batch]
    first_id: str | None
    last_id: str | None
    has_more: bool

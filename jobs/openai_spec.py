"""OpenAI-compatible request bodies (/v1/chat/completions, /v1/completions, the lines of a batch input file, and
POST /v1/batches), and how a request becomes a job item. Shared by the sync routes and batch validation, so a batch
line is accepted exactly when the same body would be accepted synchronously.

Fields OpenAI defines that this server cannot honour (n > 1, penalties, logprobs, tools, ...) are refused, not
ignored; our decoding fields (top_k, parallel_degree, validation_threshold, max_new_tokens) are accepted as
extensions.
"""
from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from .spec import DecodeOverrides, ItemIn, Message, Strict, Text, metadata_limits

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"


class StreamOptions(Strict):
    include_usage: bool = False


class OpenAIRequest(DecodeOverrides):
    """What the chat and completion requests share: OpenAI's decode fields on top of ours."""
    model: str = Field(min_length=1, max_length=256)
    max_completion_tokens: int | None = Field(None, ge=1, description="Newer name of max_tokens.")
    n: int = Field(1, ge=1, le=1, description="Only 1 choice per request.")
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = Field(None, ge=0, le=0, description="Not supported: 0 only.")
    frequency_penalty: float | None = Field(None, ge=0, le=0, description="Not supported: 0 only.")
    user: str | None = Field(None, max_length=256, description="Accepted, not used.")

    @model_validator(mode="after")
    def _max_completion_tokens_alias(self):
        return self.fold_into_max_new_tokens("max_completion_tokens")

    def decode_fields(self) -> dict:
        """The item's decode overrides (the OpenAI-only fields dropped)."""
        return self.model_dump(exclude_none=True, include=set(DecodeOverrides.model_fields))


class ChatCompletionRequest(OpenAIRequest):
    messages: list[Message] = Field(min_length=1, max_length=256)
    logprobs: Literal[False] | None = Field(None, description="Not supported.")

    def item(self, custom_id: str | None = None) -> ItemIn:
        return ItemIn(custom_id=custom_id, messages=self.messages, **self.decode_fields())


class CompletionRequest(OpenAIRequest):
    """A legacy completion. Its prompt is sent as one user turn with the chat template applied (as /generate and
    job items do): the served models are instruction-tuned, and raw-text continuation is not offered."""
    prompt: Text | list[Text] = Field(description="A string (or a list holding one string).")
    echo: Literal[False] | None = Field(None, description="Not supported.")
    logprobs: None = Field(None, description="Not supported.")

    @model_validator(mode="after")
    def _one_prompt(self):
        prompts = [self.prompt] if isinstance(self.prompt, str) else self.prompt
        if len(prompts) != 1 or not prompts[0]:
            raise ValueError("prompt: one non-empty string (several prompts: send several requests or a batch)")
        self.prompt = prompts[0]
        return self

    def item(self, custom_id: str | None = None) -> ItemIn:
        return ItemIn(custom_id=custom_id, prompt=self.prompt, **self.decode_fields())


class BatchLine(Strict):
    """One line of a batch input file (OpenAI's and vLLM run-batch's format)."""
    custom_id: Text = Field(min_length=1, max_length=256)
    method: Literal["POST"] = "POST"
    url: str
    body: dict


class BatchCreate(Strict):
    input_file_id: str = Field(min_length=1, max_length=64)
    endpoint: Literal["/v1/chat/completions", "/v1/completions"]
    completion_window: Literal["24h"]
    metadata: dict[str, str] | None = Field(None, description="Up to 16 keys (64 chars), values 512 chars.")

    @field_validator("metadata")
    @classmethod
    def _metadata_limits(cls, value):
        return metadata_limits(value)


class BatchListQuery(Strict):
    limit: int = Field(20, ge=1, le=100)
    after: str | None = Field(None, max_length=64, description="A batch id: the page after it.")


class FileListQuery(Strict):
    limit: int = Field(100, ge=1, le=10_000)
    after: str | None = Field(None, max_length=64, description="A file id: the page after it.")
    purpose: str | None = Field(None, max_length=32)
    order: Literal["asc", "desc"] = "desc"

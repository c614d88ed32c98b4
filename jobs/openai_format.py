"""OpenAI response bodies built from an item's stored result: the synchronous routes and the lines of a batch's
output file use the same functions, so a batch answer is byte-for-byte what the sync route would have returned
(ids and timestamps aside).

Every body carries one extension field, `eagle3`: the item's speculative-decoding stats (see `eagle3_stats`).
"""
from __future__ import annotations

from .openai_spec import CHAT, COMPLETIONS, ChatCompletionRequest, CompletionRequest, OpenAIRequest


def eagle3_stats(stats: dict | None, baseline: dict | None = None) -> dict | None:
    """The `eagle3` extension field: accept_length (tau: tokens per target forward round), tokens_per_s (new tokens
    over the item's share of its batch's wall time), speedup over vanilla decoding (`measured` when the item was
    also decoded without speculation, else `estimated` as new_tokens / target_forwards, an upper bound)."""
    if not stats:
        return None
    tokens, share = stats.get("new_tokens", 0), stats.get("time_share_s", 0.0)
    tps = tokens / share if share > 0 else None
    speedup, kind = None, None
    if baseline and baseline.get("time_share_s", 0) > 0 and baseline.get("new_tokens") and tps:
        speedup, kind = tps / (baseline["new_tokens"] / baseline["time_share_s"]), "measured"
    elif stats.get("target_forwards"):
        speedup, kind = tokens / stats["target_forwards"], "estimated"
    return {"accept_length": stats.get("accept_length"), "tokens_per_s": tps, "speedup": speedup,
            "speedup_kind": kind, "new_tokens": tokens, "target_forwards": stats.get("target_forwards"),
            "speculative": stats.get("speculative"), "decode_time_s": share}


def usage(stats: dict | None, output: dict) -> dict:
    """OpenAI's usage: the prompt's tokens (chat template included) and the answer's tokens (after a stop string
    cut it; the decoder may have decoded further: that work shows in eagle3.new_tokens)."""
    prompt = (stats or {}).get("prompt_tokens", 0)
    completion = len(output["token_ids"])
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


class Endpoint:
    """One OpenAI route: its request body, and how its answers look (the object, its choice, its stream chunks).
    The sync route and the batch lines for it both use it, so a batch answer is what the sync route returns.
    Another route: one subclass in ENDPOINTS."""
    path: str
    request: type[OpenAIRequest]
    id_prefix: str  # of response ids: "chatcmpl-...", "cmpl-..."
    object: str
    chunk_object: str

    def choice(self, text: str, finish: str) -> dict:
        raise NotImplementedError

    def chunk_choice(self, text: str | None, finish: str | None = None) -> dict:
        """A stream chunk's choice: `text` appended to the answer (None: nothing), `finish` on the last one."""
        raise NotImplementedError

    def opening(self) -> list[dict]:
        """The chunk choices sent before any text."""
        return []

    def text(self, body: dict) -> str:
        """The answer's text in a response body."""
        raise NotImplementedError


class Chat(Endpoint):
    path, id_prefix, object, chunk_object = CHAT, "chatcmpl", "chat.completion", "chat.completion.chunk"
    request = ChatCompletionRequest

    def choice(self, text, finish):
        return {"index": 0, "message": {"role": "assistant", "content": text, "refusal": None}, "logprobs": None,
                "finish_reason": finish}

    def chunk_choice(self, text, finish=None):
        return {"index": 0, "delta": {} if text is None else {"content": text}, "logprobs": None,
                "finish_reason": finish}

    def opening(self):
        return [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}]

    def text(self, body):
        return body["choices"][0]["message"]["content"]


class Completion(Endpoint):
    # OpenAI streams legacy completions as text_completion objects too.
    path, id_prefix, object, chunk_object = COMPLETIONS, "cmpl", "text_completion", "text_completion"
    request = CompletionRequest

    def choice(self, text, finish):
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}

    def chunk_choice(self, text, finish=None):
        return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}

    def text(self, body):
        return body["choices"][0]["text"]


ENDPOINTS: dict[str, Endpoint] = {e.path: e for e in (Chat(), Completion())}


def response_body(endpoint: str, request_id: str, created: int, model: str, output: dict, stats: dict | None,
                  baseline: dict | None = None) -> dict:
    """A chat.completion or text_completion object for one finished item."""
    kind = ENDPOINTS[endpoint]
    choice = kind.choice(output["text"], (stats or {}).get("finish_reason", "length"))
    return {"id": request_id, "object": kind.object, "created": created, "model": model, "choices": [choice],
            "usage": usage(stats, output), "eagle3": eagle3_stats(stats, baseline)}


def chunk(endpoint: str, head: dict, choice: dict) -> dict:
    """One stream chunk; `head`: the response's {id, created, model}."""
    return {"id": head["id"], "object": ENDPOINTS[endpoint].chunk_object, "created": head["created"],
            "model": head["model"], "choices": [choice]}


def closing_chunks(endpoint: str, body: dict, include_usage: bool) -> list[dict]:
    """The chunks after the text: the finish reason (with the `eagle3` stats), then the usage if asked for."""
    kind = ENDPOINTS[endpoint]
    last = {**chunk(endpoint, body, kind.chunk_choice(None, body["choices"][0]["finish_reason"])),
            "eagle3": body["eagle3"]}
    if not include_usage:
        return [last]
    return [last, {**chunk(endpoint, body, kind.chunk_choice(None)), "choices": [], "usage": body["usage"]}]


def model_id(target: str) -> str:
    """The name the served model goes by: the target name, or its directory's name."""
    return target.rstrip("/").rsplit("/", 1)[-1]

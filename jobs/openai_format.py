"""OpenAI response bodies built from an item's stored result: the synchronous routes and the lines of a batch's
output file use the same functions, so a batch answer is byte-for-byte what the sync route would have returned
(ids and timestamps aside).

Every body carries one extension field, `eagle3`: the item's speculative-decoding stats (see `eagle3_stats`).
"""
from __future__ import annotations

from .openai_spec import CHAT


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


def response_body(endpoint: str, request_id: str, created: int, model: str, output: dict, stats: dict | None,
                  baseline: dict | None = None) -> dict:
    """A chat.completion or text_completion object for one finished item."""
    finish = (stats or {}).get("finish_reason", "length")
    if endpoint == CHAT:
        choice = {"index": 0, "message": {"role": "assistant", "content": output["text"], "refusal": None},
                  "logprobs": None, "finish_reason": finish}
        kind = "chat.completion"
    else:
        choice = {"index": 0, "text": output["text"], "logprobs": None, "finish_reason": finish}
        kind = "text_completion"
    return {"id": request_id, "object": kind, "created": created, "model": model, "choices": [choice],
            "usage": usage(stats, output), "eagle3": eagle3_stats(stats, baseline)}


def stream_chunks(endpoint: str, body: dict, include_usage: bool):
    """The finished answer as server-sent-event chunks: role, content, finish reason, [usage], then [DONE]. The
    item is decoded as one piece by the worker, so the chunks arrive together once it is done."""
    choice = body["choices"][0]
    base = {"id": body["id"], "created": body["created"], "model": body["model"]}
    if endpoint == CHAT:
        base["object"] = "chat.completion.chunk"
        deltas = [{"role": "assistant", "content": ""}, {"content": choice["message"]["content"]}, {}]
        choices = [{"index": 0, "delta": d, "logprobs": None, "finish_reason": None} for d in deltas]
    else:
        base["object"] = "text_completion"
        choices = [{"index": 0, "text": t, "logprobs": None, "finish_reason": None} for t in (choice["text"], "")]
    choices[-1]["finish_reason"] = choice["finish_reason"]
    chunks = [{**base, "choices": [c]} for c in choices]
    chunks[-1]["eagle3"] = body["eagle3"]
    if include_usage:
        chunks.append({**base, "choices": [], "usage": body["usage"]})
    return chunks


def model_id(target: str) -> str:
    """The name the served model goes by: the target name, or its directory's name."""
    return target.rstrip("/").rsplit("/", 1)[-1]

"""OpenAI-compatible synchronous routes: /v1/chat/completions (plain and `stream: true`), /v1/completions and
/v1/models. A request is one item through the same queue as every job, at top priority (api.views.submit_one).

With `stream: true` the worker streams the item's text as it decodes (jobs/streaming.py) and this relays it as
server-sent events in OpenAI's chunk format; once the result is stored, the rest of the answer (whatever the stream
did not carry), the finish reason, the usage if asked for, and `[DONE]` follow."""
from __future__ import annotations

import json
import time

import redis
from flask import Blueprint, Response, current_app
from sqlalchemy import select

from jobs import streaming
from jobs.models import Item
from jobs.openai_format import ENDPOINTS, chunk, closing_chunks, model_id, response_body
from jobs.openai_spec import CHAT, COMPLETIONS

from .errors import ApiError
from .views import item_result, json_body, run_one, state, submit_one, validate

bp = Blueprint("openai", __name__)
POLL_S = 0.25  # how often a stream checks Postgres for the item's result


def served_model() -> str:
    return model_id(current_app.extensions["jobs"].settings.target)


def check_model(name: str) -> None:
    if name != served_model():
        raise ApiError(404, "model_not_found", f"The model `{name}` does not exist; this server serves "
                       f"`{served_model()}` (GET /v1/models)", errors=[{"field": "model", "type": "model_not_found"}])


def complete(endpoint: str):
    request = validate(ENDPOINTS[endpoint].request, json_body())
    check_model(request.model)
    if request.stream:
        return stream(endpoint, request)
    job, result = run_one(request.item(), endpoint)
    if result.error is not None:
        raise ApiError(502, "Generation failed", result.error, job_id=str(job.id))
    return response_body(endpoint, f"{ENDPOINTS[endpoint].id_prefix}-{job.id.hex}", int(job.created_at.timestamp()),
                         request.model, result.output, result.stats, result.baseline_stats)


def stream(endpoint: str, request) -> Response:
    """Submit now (so a bad request or a full queue is still an ordinary error response), then stream."""
    job = submit_one(request.item(), endpoint, stream=True)
    s = state()
    with s.Session() as session:
        item_id = session.scalar(select(Item.id).where(Item.job_id == job.id))
    head = {"id": f"{ENDPOINTS[endpoint].id_prefix}-{job.id.hex}", "created": int(job.created_at.timestamp()),
            "model": request.model}
    include_usage = bool(request.stream_options and request.stream_options.include_usage)
    events = stream_events(endpoint, head, job, streaming.key(s.settings.queue, item_id), s, include_usage)
    return Response(events, mimetype="text/event-stream", headers={"Cache-Control": "no-cache"})


def sse(data: dict | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n"


def stream_events(endpoint: str, head: dict, job, stream_key: str, s, include_usage: bool):
    kind = ENDPOINTS[endpoint]
    for choice in kind.opening():
        yield sse(chunk(endpoint, head, choice))
    sent, result = "", None
    for piece in increments(s, job, stream_key):
        if isinstance(piece, str):
            sent += piece
            yield sse(chunk(endpoint, head, kind.chunk_choice(piece)))
        else:
            result = piece
    if result is None or result.error is not None:
        # The 200 is already sent: OpenAI's clients raise on an `error` event.
        message = f"no result within {s.settings.generate_timeout_s:g} s" if result is None else result.error
        yield sse({"error": {"message": message, "type": "server_error", "param": None,
                             "code": "timeout" if result is None else "generation_failed"}})
        return
    body = response_body(endpoint, head["id"], head["created"], head["model"], result.output, result.stats,
                         result.baseline_stats)
    final = kind.text(body)
    if not final.startswith(sent):  # a retried decode sampled another answer than the one partly streamed
        yield sse({"error": {"message": "the item was decoded again and its answer differs from the text streamed "
                             "so far; request it again without `stream`", "type": "server_error", "param": None,
                             "code": "stream_diverged"}})
        return
    if len(final) > len(sent):  # what the stream did not carry
        yield sse(chunk(endpoint, head, kind.chunk_choice(final[len(sent):])))
    for event in closing_chunks(endpoint, body, include_usage):
        yield sse(event)
    yield sse("[DONE]")


def increments(s, job, stream_key: str):
    """The worker's text increments as they arrive, then the item's stored result (None on timeout). Without Redis
    the result alone arrives, once stored."""
    deadline, after, live, checked = time.monotonic() + s.settings.generate_timeout_s, "0", True, 0.0
    while True:
        if time.monotonic() - checked >= POLL_S:
            checked = time.monotonic()
            if (result := item_result(job, s)) is not None:
                yield result
                return
            if checked > deadline:
                yield None
                return
        if not live:
            time.sleep(POLL_S)
            continue
        try:
            deltas, after = streaming.read(s.redis, stream_key, after, int(POLL_S * 1000))
        except redis.RedisError:
            live = False
            continue
        yield from deltas


@bp.post("/v1/chat/completions")
def chat_completions():
    return complete(CHAT)


@bp.post("/v1/completions")
def completions():
    return complete(COMPLETIONS)


def model_object() -> dict:
    return {"id": served_model(), "object": "model", "created": 0, "owned_by": "eagle3-jobs"}


@bp.get("/v1/models")
def list_models():
    return {"object": "list", "data": [model_object()]}


@bp.get("/v1/models/<model>")
def get_model(model: str):
    check_model(model)
    return model_object()

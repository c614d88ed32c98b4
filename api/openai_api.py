"""OpenAI-compatible synchronous routes: /v1/chat/completions (plain and `stream: true`), /v1/completions and
/v1/models. A request is one item through the same queue as every job, at top priority (api.views.run_one)."""
from __future__ import annotations

import json

from flask import Blueprint, Response, current_app

from jobs.openai_format import model_id, response_body, stream_chunks
from jobs.openai_spec import CHAT, COMPLETIONS, REQUESTS

from .errors import ApiError
from .views import json_body, run_one, validate

bp = Blueprint("openai", __name__)


def served_model() -> str:
    return model_id(current_app.extensions["jobs"].settings.target)


def check_model(name: str) -> None:
    if name != served_model():
        raise ApiError(404, "model_not_found", f"The model `{name}` does not exist; this server serves "
                       f"`{served_model()}` (GET /v1/models)", errors=[{"field": "model", "type": "model_not_found"}])


def complete(endpoint: str):
    request = validate(REQUESTS[endpoint], json_body())
    check_model(request.model)
    job, result = run_one(request.item(), endpoint)
    if result.error is not None:
        raise ApiError(502, "Generation failed", result.error, job_id=str(job.id))
    prefix = "chatcmpl" if endpoint == CHAT else "cmpl"
    body = response_body(endpoint, f"{prefix}-{job.id.hex}", int(job.created_at.timestamp()), request.model,
                         result.output, result.stats, result.baseline_stats)
    if not request.stream:
        return body
    include_usage = bool(request.stream_options and request.stream_options.include_usage)
    events = [f"data: {json.dumps(chunk)}\n\n" for chunk in stream_chunks(endpoint, body, include_usage)]
    return Response([*events, "data: [DONE]\n\n"], mimetype="text/event-stream",
                    headers={"Cache-Control": "no-cache"})


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

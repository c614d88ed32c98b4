"""Every error is an RFC 9457 problem (application/problem+json): 404/405/413 from routing included, never an HTML
page or a traceback. The OpenAI-compatible routes answer in OpenAI's error shape instead (`openai_error`)."""
from __future__ import annotations

import logging

from flask import Flask, jsonify, request
from pydantic import ValidationError
from sqlalchemy import exc as sa_exc
from werkzeug.exceptions import HTTPException

log = logging.getLogger(__name__)


class ApiError(Exception):
    """Raise anywhere in a view to answer with a problem."""

    def __init__(self, status: int, title: str, detail: str | None = None, errors: list[dict] | None = None,
                 headers: dict | None = None, **extra):
        super().__init__(detail or title)
        self.status, self.title, self.detail, self.errors, self.extra = status, title, detail, errors, extra
        self.headers = headers or {}


def field_name(loc) -> str:
    """('items', 3, 'prompt') -> 'items[3].prompt'"""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "body"


def validation_errors(exc: ValidationError, prefix=(), lines: list[int] | None = None) -> list[dict]:
    """pydantic errors as [{field, message, type[, line]}]; `lines` maps items[i] to JSONL line numbers."""
    out = []
    for err in exc.errors(include_url=False, include_context=False, include_input=False):
        loc = tuple(prefix) + tuple(err["loc"])
        entry = {"field": field_name(loc), "message": err["msg"], "type": err["type"]}
        if lines is not None and len(loc) > 1 and loc[0] == "items" and isinstance(loc[1], int):
            entry["line"] = lines[loc[1]]
        out.append(entry)
    return out


def invalid(errors: list[dict], status: int = 422, title: str = "Invalid request") -> ApiError:
    first = errors[0]
    where = f"line {first['line']}: " if first.get("line") else ""
    return ApiError(status, title, f"{where}{first['field']}: {first['message']}", errors)


# Routes that follow OpenAI's API: their errors take OpenAI's shape, so its clients raise their usual exceptions.
OPENAI_ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/models", "/v1/files", "/v1/batches")
OPENAI_TYPES = {401: "authentication_error", 403: "permission_error", 404: "not_found_error",
                409: "conflict_error", 429: "rate_limit_error"}


def openai_route(path: str) -> bool:
    return any(path == route or path.startswith(route + "/") for route in OPENAI_ROUTES)


def openai_error(status: int, title: str, detail: str | None, errors, **extra):
    """{"error": {message, type, param, code}}; an invalid field is 400 there (OpenAI's client has no 422 habit)."""
    status = 400 if status == 422 else status
    first = (errors or [{}])[0]
    kind = "server_error" if status >= 500 else OPENAI_TYPES.get(status, "invalid_request_error")
    body = {"message": detail or title, "type": kind, "param": first.get("field"),
            "code": first.get("type") or title.lower().replace(" ", "_"),
            **{k: v for k, v in extra.items() if v is not None}}
    response = jsonify({"error": body})
    response.status_code = status
    return response


def problem(status: int, title: str, detail: str | None = None, errors=None, **extra):
    if openai_route(request.path):
        return openai_error(status, title, detail, errors, **extra)
    body = {"type": "about:blank", "title": title, "status": status, "instance": request.path}
    if detail:
        body["detail"] = detail
    if errors:
        body["errors"] = errors
    body.update({k: v for k, v in extra.items() if v is not None})
    response = jsonify(body)
    response.status_code = status
    response.mimetype = "application/problem+json"
    return response


def register(app: Flask) -> None:
    @app.errorhandler(ApiError)
    def _api_error(exc: ApiError):
        response = problem(exc.status, exc.title, exc.detail, exc.errors, **exc.extra)
        response.headers.update(exc.headers)
        return response

    @app.errorhandler(HTTPException)
    def _http_error(exc: HTTPException):
        response = problem(exc.code or 500, exc.name, exc.description)
        if exc.code == 405 and exc.valid_methods:
            response.headers["Allow"] = ", ".join(exc.valid_methods)
        return response

    @app.errorhandler(sa_exc.OperationalError)
    @app.errorhandler(sa_exc.InterfaceError)
    def _database_down(exc: Exception):
        log.warning("database unavailable on %s %s: %s", request.method, request.path, exc.__class__.__name__)
        response = problem(503, "Database unavailable", "the database cannot be reached; retry later")
        response.headers["Retry-After"] = "5"
        return response

    @app.errorhandler(Exception)
    def _unexpected(exc: Exception):
        log.exception("unhandled error on %s %s", request.method, request.path)
        return problem(500, "Internal Server Error", "An unexpected error occurred; it has been logged.")

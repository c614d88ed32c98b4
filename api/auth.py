"""API-key authentication.

Every /v1 route and /generate need `Authorization: Bearer <key>`. /health, /metrics and /openapi.json stay open and
reveal nothing about jobs. The status page (`GET /`) takes the key from an HttpOnly cookie set by its login form
(see api/status.py); the cookie is accepted there only, never by the JSON API, so a cross-site request cannot use it.

Two before_request hooks: `identify` (runs before the rate limiter, so the limiter can key on the API key) and
`enforce` (after it, so calls with a bad key are still limited per IP).
"""
from __future__ import annotations

from flask import Flask, current_app, g, request

from jobs import keys

from .errors import ApiError

COOKIE = "e3k_session"


def protected(path: str) -> bool:
    return path == "/v1" or path.startswith("/v1/") or path == "/generate"


def bearer() -> str | None:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def lookup(token: str | None):
    """(id, name) of the active key `token`, else None."""
    if not token:
        return None
    with current_app.extensions["jobs"].Session() as session:
        row = keys.authenticate(session, token)
        return (row.id, row.name) if row is not None else None


def key_id() -> int:
    """The authenticated caller's key id (only inside protected routes)."""
    return g.api_key_id


def current_key_id() -> int | None:
    return g.get("api_key_id")


def init_identify(app: Flask) -> None:
    @app.before_request
    def identify():
        g.api_key_id = g.api_key_name = None
        if protected(request.path):
            token = bearer()
            g.auth_error = "send Authorization: Bearer <API key>" if token is None else None
            found = lookup(token)
            if found is None and token is not None:
                g.auth_error = "the API key is invalid or revoked"
        elif request.path == "/":
            found = lookup(request.cookies.get(COOKIE))
        else:
            found = None
        if found is not None:
            g.api_key_id, g.api_key_name = found


def init_enforce(app: Flask) -> None:
    @app.before_request
    def enforce():
        if protected(request.path) and g.get("api_key_id") is None:
            error = 'Bearer realm="eagle3"' + (', error="invalid_token"' if bearer() else "")
            raise ApiError(401, "Unauthorized", g.get("auth_error") or "an API key is required",
                           headers={"WWW-Authenticate": error})

"""Request rate limits (Flask-Limiter, counters in Redis so all gunicorn workers and hosts share them).

Keyed by the API key id when the call carries a valid key, else by the client IP. Over the limit: 429
problem+json with Retry-After. /health and /metrics are exempt (probes and scrapers must not be throttled).
If the limiter's Redis is unreachable, requests are let through and the error is logged (fail open: the limiter
guards capacity, it must not turn a Redis outage into an API outage).
"""
from __future__ import annotations

import time

from flask import Flask, g, request
from flask_limiter import Limiter, RequestLimit

from .errors import problem

EXEMPT = ("/health", "/metrics")


def limit_key() -> str:
    key_id = g.get("api_key_id")
    return f"key:{key_id}" if key_id is not None else f"ip:{request.remote_addr or 'unknown'}"


def init_app(app: Flask, settings) -> Limiter:
    def current_limit() -> str:
        return settings.rate_limit if g.get("api_key_id") is not None else settings.rate_limit_unauthenticated

    def on_breach(limit: RequestLimit):
        retry = max(1, int(limit.reset_at - time.time()) + 1)
        response = problem(429, "Too Many Requests", f"rate limit {limit.limit} exceeded; retry in {retry} s")
        response.headers["Retry-After"] = str(retry)
        return response

    limiter = Limiter(
        # application limits: one budget per key (or IP) across all routes, not one per route
        limit_key, app=app, application_limits=[current_limit], storage_uri=settings.rate_limit_storage_uri,
        storage_options={"socket_connect_timeout": 1, "socket_timeout": 1},
        key_prefix=settings.rate_limit_key_prefix, strategy="moving-window", headers_enabled=True,
        swallow_errors=True, on_breach=on_breach,
        application_limits_exempt_when=lambda: request.path in EXEMPT)
    return limiter

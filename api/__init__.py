"""The HTTP API: a Flask app factory. Views validate, write to Postgres and send queue messages; they never decode."""
from __future__ import annotations

import dataclasses

import redis
from flask import Flask

from jobs.config import Settings, get_settings
from jobs.db import session_factory
from jobs.logs import configure_logging
from jobs.queue import make_celery

from . import errors


@dataclasses.dataclass
class State:
    settings: Settings
    Session: object  # sessionmaker
    celery: object  # a Celery app used only to send messages and ping workers
    limiter: object = None  # flask_limiter.Limiter
    redis: object = None  # redis.Redis of the token streams (jobs/streaming.py); connects on first use


def create_app(overrides: dict | None = None) -> Flask:
    """`overrides`: Settings fields to replace (tests use a unique queue, small limits)."""
    settings = dataclasses.replace(get_settings(), **(overrides or {}))
    app = Flask(__name__)
    app.config["MAX_CONTENT_LENGTH"] = settings.max_request_bytes  # larger bodies: 413
    app.json.sort_keys = False
    app.extensions["jobs"] = State(settings=settings, Session=session_factory(settings.database_url),
                                   celery=make_celery(settings),
                                   redis=redis.Redis.from_url(settings.redis_url, socket_timeout=5.0))
    configure_logging()

    from . import auth, metrics, ratelimit
    from .batches import bp as batches_bp
    from .files import bp as files_bp
    from .health import bp as health_bp
    from .openai_api import bp as openai_bp
    from .openapi import bp as openapi_bp
    from .schedules import bp as schedules_bp
    from .status import bp as status_bp
    from .views import bp as jobs_bp

    metrics.init_app(app)
    # Order matters: identify the key, then rate-limit (by key or IP), then reject unauthenticated /v1 calls.
    auth.init_identify(app)
    app.extensions["jobs"].limiter = ratelimit.init_app(app, settings)
    auth.init_enforce(app)
    app.register_blueprint(jobs_bp)
    app.register_blueprint(schedules_bp)
    app.register_blueprint(health_bp)
    app.register_blueprint(metrics.bp)
    app.register_blueprint(status_bp)
    app.register_blueprint(openapi_bp)
    app.register_blueprint(openai_bp)
    app.register_blueprint(files_bp)
    app.register_blueprint(batches_bp)
    errors.register(app)
    return app

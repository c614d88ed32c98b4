"""GET /health: the database, the broker, and a worker serving the batch queue."""
from __future__ import annotations

from flask import Blueprint, current_app
from sqlalchemy import text

from .errors import problem

bp = Blueprint("health", __name__)


def _database(state) -> dict:
    with state.Session() as session:
        session.execute(text("SELECT 1"))
    return {"ok": True}


def _broker(state) -> dict:
    with state.celery.connection_for_write() as connection:
        connection.ensure_connection(max_retries=1, timeout=2)
    return {"ok": True}


def _workers(state) -> dict:
    queue = state.settings.queue
    replies = state.celery.control.inspect(timeout=1.0).active_queues() or {}
    serving = sorted(name for name, queues in replies.items() if any(q["name"] == queue for q in queues))
    if not serving:
        return {"ok": False, "error": f"no worker answered for queue {queue!r}"}
    return {"ok": True, "workers": serving}


@bp.get("/health")
def health():
    state = current_app.extensions["jobs"]
    checks = {}
    for name, check in (("database", _database), ("broker", _broker), ("workers", _workers)):
        if name == "workers" and not checks["broker"]["ok"]:
            checks[name] = {"ok": False, "error": "not checked: the broker is down"}
            continue
        try:
            checks[name] = check(state)
        except Exception as exc:  # noqa: BLE001 - any failure of a dependency is reported, not raised
            checks[name] = {"ok": False, "error": f"{exc.__class__.__name__}: {exc}"[:300]}
    if all(c["ok"] for c in checks.values()):
        return {"status": "ok", "checks": checks}
    failed = ", ".join(name for name, c in checks.items() if not c["ok"])
    return problem(503, "Service Unavailable", f"failed: {failed}", checks=checks)

"""GET /: a small server-rendered status page of the caller's recent jobs (status, progress, and an inline SVG chart
of tau and speedup per job). No JavaScript, no build step.

How a browser authenticates: the page shows a form; POST /login with the API key sets an HttpOnly, SameSite=Strict
cookie holding the key (Secure over HTTPS), valid for the page only: the JSON API ignores it and still needs a
Bearer header, so the cookie cannot be used for cross-site requests against /v1. `GET /?key=...` does the same
and redirects to `/` (handy for bookmarks and tests, but the key then appears in access logs and browser
history: prefer the form). POST /logout clears the cookie. The page is revalidated on every request, so a revoked
key stops working at once.
"""
from __future__ import annotations

from flask import Blueprint, current_app, g, redirect, render_template, request
from sqlalchemy import select

from jobs.models import Job

from . import auth
from .views import job_stats

bp = Blueprint("status", __name__)
RECENT = 25
CHART_JOBS = 12
COOKIE_MAX_AGE = 8 * 3600
CSP = ("default-src 'none'; style-src 'unsafe-inline'; img-src data:; form-action 'self'; "
       "frame-ancestors 'none'; base-uri 'none'")


def page(template: str, status: int = 200, **context):
    response = current_app.make_response((render_template(template, **context), status))
    response.headers["Content-Security-Policy"] = CSP
    response.headers["X-Frame-Options"] = "DENY"
    response.headers["Cache-Control"] = "no-store"
    response.headers["Referrer-Policy"] = "no-referrer"
    return response


def login_form(error: str | None = None, status: int = 200):
    return page("login.html", status, error=error)


def signed_in(key: str):
    response = redirect("/", code=303)
    response.set_cookie(auth.COOKIE, key, max_age=COOKIE_MAX_AGE, httponly=True, samesite="Strict",
                        secure=request.is_secure, path="/")
    return response


def try_login(key: str | None):
    key = (key or "").strip()
    if not key or len(key) > 200:
        return login_form("enter an API key", 400 if key else 200)
    if auth.lookup(key) is None:
        return login_form("that API key is invalid or revoked", 401)
    return signed_in(key)


def chart(rows: list[dict]) -> dict:
    """Bar-chart geometry for the inline SVG: two bars (tau, speedup) per job, oldest first."""
    jobs = [r for r in rows if r["tau"] is not None or r["speedup"] is not None][:CHART_JOBS][::-1]
    top = max([1.0] + [v for r in jobs for v in (r["tau"] or 0, r["speedup"] or 0)]) * 1.15
    width, height, left, bottom, slot = 640, 220, 40, 30, 600 / max(1, len(jobs))
    plot = height - bottom - 10

    def y(v):
        return height - bottom - plot * v / top

    bars = []
    for i, r in enumerate(jobs):
        x = left + i * slot + slot * 0.15
        w = slot * 0.32
        for j, (kind, value) in enumerate((("tau", r["tau"]), ("speedup", r["speedup"]))):
            if value is not None:
                bars.append({"kind": kind, "x": round(x + j * w, 1), "y": round(y(value), 1), "w": round(w, 1),
                             "h": round(plot * value / top, 1), "label": f"{value:.2f}", "job": r["short"]})
    ticks = [{"y": round(y(v), 1), "label": f"{v:g}"} for v in range(0, int(top) + 1)]
    return {"width": width, "height": height, "bars": bars, "ticks": ticks, "one": round(y(1.0), 1),
            "left": left, "baseline": height - bottom,
            "labels": [{"x": round(left + i * slot + slot / 2, 1), "text": r["short"]} for i, r in enumerate(jobs)]}


@bp.get("/")
def status_page():
    if "key" in request.args:
        return try_login(request.args.get("key"))
    if g.get("api_key_id") is None:
        return login_form()
    with current_app.extensions["jobs"].Session() as session:
        jobs = session.scalars(select(Job).where(Job.api_key_id == g.api_key_id)
                               .order_by(Job.created_at.desc(), Job.id.desc()).limit(RECENT)).all()
    rows = []
    for job in jobs:
        stats = job_stats(job)
        done = job.completed_items + job.failed_items + job.cancelled_items
        rows.append({"id": str(job.id), "short": str(job.id)[:8], "type": job.type, "status": job.status,
                     "progress": done / job.total_items if job.total_items else 1.0, "done": done,
                     "total": job.total_items, "failed": job.failed_items, "created": job.created_at,
                     "tau": stats["mean_accept_length"], "speedup": stats["speedup"],
                     "speedup_kind": stats["speedup_kind"], "tokens_per_s": stats["tokens_per_s"],
                     "scheduled": job.schedule_id is not None})
    return page("status.html", rows=rows, chart=chart(rows), key_name=g.api_key_name)


@bp.post("/login")
def login():
    return try_login(request.form.get("key"))


@bp.post("/logout")
def logout():
    response = redirect("/", code=303)
    response.delete_cookie(auth.COOKIE, path="/")
    return response

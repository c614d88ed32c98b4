"""Shared fixtures for the job-system tests: a fresh Postgres database migrated with Alembic, a unique Celery queue on
the real Redis, and a real Celery worker subprocess (tiny target). Nothing is mocked.

The environment is set here, before any project module reads it, so every part (API app, worker subprocess,
helpers) agrees on the database, queue and target of this test session.
"""
from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

ROOT = Path(__file__).resolve().parent.parent
RUN_ID = secrets.token_hex(4)
SERVER_URL = make_url(os.environ.get("DATABASE_URL", "postgresql+psycopg://root@127.0.0.1:5432/test"))
TEST_DB = f"test_{RUN_ID}"
QUEUE = f"test-{RUN_ID}"
os.environ.update({
    "DATABASE_URL": SERVER_URL.set(database=TEST_DB).render_as_string(hide_password=False),
    "EAGLE3_TARGET": "tiny",
    "CELERY_QUEUE": QUEUE,
    "BATCH_SIZE": "8",
    "BATCH_FLUSH_INTERVAL": "0.3",
    "BASELINE_SAMPLE_SIZE": "4",
    "GENERATE_TIMEOUT_S": "60",
    # Tests (load tests included) are not throttled unless they build an app with their own limits; counters
    # live under this session's prefix, so purge_redis removes them.
    "RATE_LIMIT": "1000000/minute",
    "RATE_LIMIT_UNAUTHENTICATED": "1000000/minute",
    "RATE_LIMIT_KEY_PREFIX": f"rl-{RUN_ID}",
    "MAX_QUEUED_ITEMS_PER_KEY": "10000000",
    "WORKER_METRICS_PORT": "0",
})
# Compiled steps in inductor's Python wrapper: the tests compile hundreds of tiny-target graphs, and the C++ wrapper
# (the engine's default on CPUs) compiles ~1.4x longer (tests/test_eagle3_compiled.py from a cold cache: 445 s
# against 326 on a 2-core EPYC). test_eagle3_compiled.py runs the C++ wrapper itself.
os.environ.setdefault("EAGLE3_CPP_WRAPPER", "0")
# Batch-1 calls on the AMX kernel, as at every other batch size (hardware.few_rows_until): many tests compare a
# prompt's tokens across batch sizes, which the VNNI kernel of batch-1 calls on AMX CPUs rounds apart, and each
# kernel would compile its own graphs. test_eagle3_compiled.py's few-rows test runs that mode, lossless included.
os.environ.setdefault("EAGLE3_FEW_ROWS", "0")

JOB_TEST_FILES = ("test_api_", "test_worker_", "test_migrations")


def pytest_collection_modifyitems(items):
    for item in items:  # a hung queue test fails in 120 s rather than stalling CI for the global 600 s
        if item.fspath.basename.startswith(JOB_TEST_FILES) and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(120))


def admin_engine():
    return create_engine(SERVER_URL, isolation_level="AUTOCOMMIT")


@pytest.fixture(scope="session")
def database():
    """A fresh database for this session, at Alembic head; dropped afterwards."""
    from alembic import command
    from alembic.config import Config

    admin = admin_engine()
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{TEST_DB}"'))
    config = Config(str(ROOT / "alembic.ini"))
    config.set_main_option("sqlalchemy.url", os.environ["DATABASE_URL"].replace("%", "%%"))
    command.upgrade(config, "head")
    yield os.environ["DATABASE_URL"]
    from jobs.db import get_engine

    for engine in (get_engine(os.environ["DATABASE_URL"]),):
        engine.dispose()
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{TEST_DB}" WITH (FORCE)'))
    admin.dispose()
    purge_redis(RUN_ID)  # every queue of this session (the worker's and the tests' extra ones) names RUN_ID


class WorkerProcess:
    """`python -m celery -A worker worker` in a subprocess, on its own queue(s)."""

    def __init__(self, queue: str, log_path: Path, **env):
        self.queue, self.log_path = queue, log_path
        self.name = f"{queue}@{os.uname().nodename}"
        self.log = open(log_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "worker", "worker", "-Q", f"{queue},{queue}.maint",
             "--pool=prefork", "--concurrency=1", "-n", self.name, "--loglevel=INFO",
             "--without-gossip", "--without-mingle"],
            cwd=ROOT, env={**os.environ, "CELERY_QUEUE": queue, **env}, stdout=self.log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 90.0) -> None:
        """Until the worker consumes our queue and its pool child has loaded the model."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker exited with {self.proc.returncode}:\n{self.tail()}")
            if b"loaded target" in self.log_path.read_bytes() and b" ready." in self.log_path.read_bytes():
                return
            time.sleep(0.2)
        raise TimeoutError(f"worker not ready after {timeout} s:\n{self.tail()}")

    def tail(self, n: int = 4000) -> str:
        return self.log_path.read_bytes()[-n:].decode(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # warm shutdown
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def purge_redis(marker: str) -> None:
    """Delete this session's queues and kombu bindings: every Redis key and binding member naming `marker`."""
    from jobs.queue import purge_redis as purge

    purge(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"), marker)


@pytest.fixture(scope="session")
def worker(database, tmp_path_factory):
    proc = WorkerProcess(QUEUE, tmp_path_factory.mktemp("worker") / "worker.log")
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="session")
def app(database):
    from api import create_app

    return create_app()


# ----------------------------------------------------------------------------------------------- API keys
_session_key: list[str] = []


def make_key(name: str = "test") -> str:
    """A new API key in the session database; returns the plaintext key."""
    from jobs import keys
    from jobs.db import session_factory

    with session_factory(os.environ["DATABASE_URL"]).begin() as session:
        return keys.create_key(session, f"{name}-{RUN_ID}")[1]


def session_key() -> str:
    """The key every test client sends unless told otherwise (created once per session)."""
    if not _session_key:
        _session_key.append(make_key("session"))
    return _session_key[0]


_app_keys: dict[str, str] = {}


def app_key(app) -> str:
    """The session key when `app` uses the session database, else a key created once in the app's own (private)
    database."""
    url = app.extensions["jobs"].settings.database_url
    if url == os.environ["DATABASE_URL"]:
        return session_key()
    if url not in _app_keys:
        from jobs import keys

        with app.extensions["jobs"].Session.begin() as session:
            _app_keys[url] = keys.create_key(session, f"private-{RUN_ID}")[1]
    return _app_keys[url]


def client_for(app, key: str | None = "session"):
    """A test client of `app` that sends `Authorization: Bearer <key>` on every request (the session key, or a key
    of the app's private database, by default; None: no header). A request's own Authorization header still wins."""
    test_client = app.test_client()
    key = app_key(app) if key == "session" else key
    if key is not None:
        test_client.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {key}"
    return test_client


@pytest.fixture(scope="session")
def api_key(database) -> str:
    """The session's API key (plaintext): what `client` and `client_for` send."""
    return session_key()


@pytest.fixture(scope="session")
def auth_headers(api_key) -> dict:
    """{"Authorization": "Bearer <session key>"}, for raw HTTP (requests against a live server)."""
    return {"Authorization": f"Bearer {api_key}"}


@pytest.fixture
def client(app, api_key):
    """The session app's test client, authenticated with the session key."""
    return client_for(app)


@pytest.fixture
def anon_client(app):
    """The session app's test client without an API key."""
    return app.test_client()


# ------------------------------------------------------------------------------------------------- helpers
@contextlib.contextmanager
def serving(app):
    """`app` served over real HTTP on a free loopback port (threaded werkzeug server); yields its base URL."""
    from werkzeug.serving import make_server

    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        thread.join(10)


def prompts(n: int, prefix: str = "Tell me about") -> list[dict]:
    return [{"custom_id": f"item-{i}", "prompt": f"{prefix} topic {i}."} for i in range(n)]


def submit(client, body: dict, headers: dict | None = None) -> dict:
    response = client.post("/v1/jobs", json=body, headers=headers or {})
    assert response.status_code == 202, response.get_json()
    return response.get_json()


def wait_for(client, job_id: str, statuses=("completed", "failed", "cancelled"), timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        job = client.get(f"/v1/jobs/{job_id}").get_json()
        if job["status"] in statuses:
            return job
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job_id} still {job['status']} after {timeout} s: {job}")
        time.sleep(0.1)


def all_results(client, job_id: str) -> list[dict]:
    response = client.get(f"/v1/jobs/{job_id}/results?format=jsonl")
    assert response.status_code == 200
    import json

    return [json.loads(line) for line in response.get_data(as_text=True).splitlines()]

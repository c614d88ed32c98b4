"""Bounded load test on loopback: API latency under a mixed submit/poll load, then one large job through a real worker,
then an exactly-once check of every item. Writes a markdown report.

    python -m bench.load                          # 200 req/s for 30 s, a 10,000-item job, bench/results/load.md
    python -m bench.load --rate 50 --duration 3 --items 300 --out /tmp/load.md      # a quick one

What it does, all on 127.0.0.1, and all of it stops by itself:
1. Creates a database of its own (`load_<random>`) at Alembic head on the Postgres server of DATABASE_URL, and a
   Celery queue of its own on Redis; both are removed at the end (--keep keeps the database).
2. Starts gunicorn (api/gunicorn.conf.py: API_WORKERS x API_THREADS gthread workers) on a free loopback port.
3. API phase: an open-loop load at --rate requests/s for --duration s (requests are sent on schedule, whatever the
   latency of earlier ones): 25% `POST /v1/jobs` (a one-item job), 65% `GET /v1/jobs/{id}`, 10%
   `GET /v1/jobs/{id}/results`, polling jobs submitted earlier. No worker runs in this phase: on this 2-core machine
   a worker would take the CPU the API is measured on (in production workers run on their own, GPU, hosts).
   Latency is measured from the scheduled send time, so a stalled server cannot hide queueing (no coordinated
   omission); the report also gives the time from the actual send.
4. Worker phase: submits one --items-item job, starts one Celery worker (prefork, concurrency 1, --batch-size
   items per batch, EAGLE3_TARGET, default tiny) and measures items/s until every item of every job is finished.
5. Checks in Postgres that every item has exactly one result row and that job counters match them.
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import queue
import random
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

ROOT = Path(__file__).resolve().parent.parent
ROUTES = ("POST /v1/jobs", "GET /v1/jobs/{id}", "GET /v1/jobs/{id}/results")
MIX = (0.25, 0.65, 0.10)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def log(message: str) -> None:
    print(f"[load {time.strftime('%H:%M:%S')}] {message}", flush=True)


# ------------------------------------------------------------------------------------------------ services
class Services:
    """The database, gunicorn and the worker of one run; stop() removes all of them."""

    def __init__(self, server_url: str, target: str, batch_size: int, logs: Path, keep: bool):
        self.server_url = make_url(server_url)
        self.run = secrets.token_hex(4)
        self.db_name, self.queue = f"load_{self.run}", f"load-{self.run}"
        self.url = self.server_url.set(database=self.db_name).render_as_string(hide_password=False)
        self.logs, self.keep = logs, keep
        self.env = {**os.environ, "DATABASE_URL": self.url, "CELERY_QUEUE": self.queue, "EAGLE3_TARGET": target,
                    "BATCH_SIZE": str(batch_size), "PYTHONPATH": str(ROOT)}
        self.api: subprocess.Popen | None = None
        self.worker: subprocess.Popen | None = None
        self.port = free_port()
        logs.mkdir(parents=True, exist_ok=True)

    def admin(self, sql: str) -> None:
        engine = create_engine(self.server_url, isolation_level="AUTOCOMMIT")
        with engine.connect() as conn:
            conn.execute(text(sql))
        engine.dispose()

    def create_database(self) -> None:
        from alembic import command
        from alembic.config import Config

        self.admin(f'CREATE DATABASE "{self.db_name}"')
        config = Config(str(ROOT / "alembic.ini"))
        config.set_main_option("sqlalchemy.url", self.url.replace("%", "%%"))
        command.upgrade(config, "head")

    def create_key(self) -> dict:
        """An API key in the run's database; returns the request headers that carry it."""
        from jobs import keys
        from jobs.db import session_factory

        with session_factory(self.url).begin() as session:
            return {"Authorization": f"Bearer {keys.create_key(session, 'load-test')[1]}"}

    def start_api(self) -> None:
        # One client drives the whole load: lift the per-key request and queued-items limits for this run.
        env = {**self.env, "PORT": str(self.port), "RATE_LIMIT": "1000000/minute",
               "MAX_QUEUED_ITEMS_PER_KEY": "100000000"}
        out = open(self.logs / "gunicorn.log", "wb")
        self.api = subprocess.Popen([sys.executable, "-m", "gunicorn", "-c", "api/gunicorn.conf.py",
                                     "--bind", f"127.0.0.1:{self.port}", "--access-logfile", "/dev/null",
                                     "api.wsgi:app"], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while True:
            try:
                status, _ = request("127.0.0.1", self.port, "GET", "/openapi.json")
                if status == 200:
                    return
            except OSError:
                pass
            if self.api.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"gunicorn did not start; see {self.logs / 'gunicorn.log'}")
            time.sleep(0.2)

    def start_worker(self) -> None:
        path = self.logs / "worker.log"
        out = open(path, "wb")
        self.worker = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "worker", "worker", "-Q", f"{self.queue},{self.queue}.maint",
             "--pool=prefork", "--concurrency=1", "-n", f"{self.queue}@%h", "--loglevel=INFO", "--without-gossip",
             "--without-mingle"], cwd=ROOT, env=self.env, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 180
        while not (b"loaded target" in path.read_bytes() and b" ready." in path.read_bytes()):
            if self.worker.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the worker did not start; see {path}")
            time.sleep(0.2)

    def stop(self) -> None:
        for proc in (self.worker, self.api):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        try:
            from jobs.queue import purge_redis

            purge_redis(self.env.get("REDIS_URL", "redis://127.0.0.1:6379/0"), self.run)
        except Exception as exc:  # noqa: BLE001 - cleanup is best effort
            log(f"redis cleanup failed: {exc!r}")
        if not self.keep:
            from jobs.db import get_engine

            get_engine(self.url).dispose()
            self.admin(f'DROP DATABASE IF EXISTS "{self.db_name}" WITH (FORCE)')


# ------------------------------------------------------------------------------------------------ HTTP client
_local = threading.local()


def request(host: str, port: int, method: str, path: str, body: bytes | None = None,
            headers: dict | None = None, timeout: float = 120) -> tuple[int, bytes]:
    """One request on this thread's keep-alive connection (reconnecting once if the server closed it)."""
    for attempt in (0, 1):
        conn = getattr(_local, "conn", None)
        if conn is None:
            conn = _local.conn = http.client.HTTPConnection(host, port, timeout=timeout)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            response = conn.getresponse()
            return response.status, response.read()
        except (http.client.HTTPException, OSError):
            conn.close()
            _local.conn = None
            if attempt:
                raise
    raise AssertionError("unreachable")


@dataclass
class Sample:
    route: str
    status: int
    latency: float  # from the scheduled send time
    service: float  # from the actual send


@dataclass
class ApiResult:
    samples: list[Sample] = field(default_factory=list)
    wall_s: float = 0.0
    scheduled: int = 0


def api_phase(port: int, rate: float, duration: float, max_new_tokens: int, threads: int, auth: dict,
              warmup: float = 0.0) -> ApiResult:
    jobs: list[str] = []
    jobs_lock = threading.Lock()
    result = ApiResult()
    counter = [0]

    def submit_body() -> bytes:
        with jobs_lock:
            counter[0] += 1
            n = counter[0]
        return json.dumps({"items": [{"prompt": f"Load test prompt {n}"}],
                           "params": {"max_new_tokens": max_new_tokens}}).encode()

    for _ in range(10):  # jobs to poll from the first request on
        status, body = request("127.0.0.1", port, "POST", "/v1/jobs", submit_body(),
                               {"Content-Type": "application/json", **auth})
        if status != 202:
            raise RuntimeError(f"seeding a job failed: {status} {body[:300]!r}")
        jobs.append(json.loads(body)["id"])

    work: queue.Queue = queue.Queue()
    rng = random.Random(1)
    skip = int(rate * warmup)  # the first requests warm connections and pools up; they are not measured
    total = skip + int(rate * duration)
    result.scheduled = total - skip
    samples_lock = threading.Lock()

    def run_one(route: str, scheduled: float, index: int) -> None:
        start = time.perf_counter()
        with jobs_lock:
            job_id = rng.choice(jobs)
        if route == ROUTES[0]:
            status, body = request("127.0.0.1", port, "POST", "/v1/jobs", submit_body(),
                                   {"Content-Type": "application/json", **auth})
            if status == 202:
                with jobs_lock:
                    jobs.append(json.loads(body)["id"])
        elif route == ROUTES[1]:
            status, _ = request("127.0.0.1", port, "GET", f"/v1/jobs/{job_id}", headers=auth)
        else:
            status, _ = request("127.0.0.1", port, "GET", f"/v1/jobs/{job_id}/results?limit=100", headers=auth)
        end = time.perf_counter()
        if index >= skip:
            with samples_lock:
                result.samples.append(Sample(route, status, end - scheduled, end - start))

    def client() -> None:
        while True:
            task = work.get()
            if task is None:
                return
            try:
                run_one(*task)
            except Exception as exc:  # noqa: BLE001 - a failed request is a sample with status 0
                if task[2] >= skip:
                    with samples_lock:
                        result.samples.append(Sample(task[0], 0, time.perf_counter() - task[1], 0.0))
                log(f"request failed: {exc!r}")

    pool = [threading.Thread(target=client, daemon=True) for _ in range(threads)]
    for t in pool:
        t.start()
    start = time.perf_counter()
    next_report = start + 1
    for i in range(total):
        scheduled = start + i / rate
        delay = scheduled - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        work.put((rng.choices(ROUTES, MIX)[0], scheduled, i))
        now = time.perf_counter()
        if now >= next_report:
            with samples_lock:
                done = len(result.samples)
                errors = sum(s.status not in (200, 202) for s in result.samples)
            log(f"api: {now - start:5.1f} s, sent {i + 1}/{total}, done {done}, non-2xx {errors}, "
                f"backlog {work.qsize()}")
            next_report = now + 1
    for _ in pool:
        work.put(None)
    for t in pool:
        t.join(timeout=180)
    result.wall_s = time.perf_counter() - start - warmup
    return result


# ------------------------------------------------------------------------------------------------ worker phase
@dataclass
class WorkerResult:
    items: int = 0
    wall_s: float = 0.0
    submit_s: float = 0.0
    startup_s: float = 0.0


def counts(url: str) -> tuple[int, int]:
    from jobs.db import get_engine

    with get_engine(url).connect() as conn:
        total, finished = conn.execute(text(
            "SELECT count(*), count(*) FILTER (WHERE status IN ('completed', 'failed', 'cancelled')) FROM items")).one()
    return total, finished


def worker_phase(services: Services, items: int, max_new_tokens: int, timeout_s: float, auth: dict) -> WorkerResult:
    result = WorkerResult()
    body = json.dumps({"items": [{"prompt": f"Bulk item {i}: summarise the news."} for i in range(items)],
                       "params": {"max_new_tokens": max_new_tokens}}).encode()
    started = time.perf_counter()
    status, answer = request("127.0.0.1", services.port, "POST", "/v1/jobs", body,
                             {"Content-Type": "application/json", **auth}, timeout=300)
    result.submit_s = time.perf_counter() - started
    if status != 202:
        raise RuntimeError(f"submitting the {items}-item job failed: {status} {answer[:300]!r}")
    log(f"worker: submitted a {items}-item job in {result.submit_s:.1f} s; starting the worker")
    started = time.perf_counter()
    services.start_worker()
    result.startup_s = time.perf_counter() - started
    total, finished = counts(services.url)
    start, start_finished = time.perf_counter(), finished
    deadline = start + timeout_s
    last = 0.0
    while finished < total:
        if time.perf_counter() > deadline:
            raise TimeoutError(f"{total - finished} items still unfinished after {timeout_s:.0f} s")
        if services.worker.poll() is not None:
            raise RuntimeError(f"the worker exited with {services.worker.returncode}")
        time.sleep(1)
        total, finished = counts(services.url)
        now = time.perf_counter()
        if now - last >= 5:
            rate = (finished - start_finished) / (now - start)
            log(f"worker: {finished}/{total} items finished, {rate:.1f} items/s, "
                f"~{(total - finished) / rate if rate else float('inf'):.0f} s to go")
            last = now
    result.items, result.wall_s = finished - start_finished, time.perf_counter() - start
    return result


# ------------------------------------------------------------------------------------------------ checks + report
def exactly_once(url: str) -> dict:
    from jobs.db import get_engine

    with get_engine(url).connect() as conn:
        row = conn.execute(text("""
            SELECT count(*) AS items,
                   count(*) FILTER (WHERE n = 0) AS without_result,
                   count(*) FILTER (WHERE n > 1) AS with_several,
                   count(*) FILTER (WHERE status NOT IN ('completed', 'failed', 'cancelled')) AS unfinished,
                   count(*) FILTER (WHERE status = 'failed') AS failed,
                   max(attempts) AS max_attempts
            FROM (SELECT i.id, i.status, i.attempts, count(r.item_id) AS n
                  FROM items i LEFT JOIN item_results r ON r.item_id = i.id GROUP BY i.id) t""")).mappings().one()
        results = conn.execute(text("SELECT count(*) FROM item_results")).scalar()
        jobs = conn.execute(text("""
            SELECT count(*) AS jobs,
                   count(*) FILTER (WHERE completed_items + failed_items + cancelled_items <> total_items) AS miscounted,
                   count(*) FILTER (WHERE status <> 'completed') AS not_completed
            FROM jobs""")).mappings().one()
    out = {**row, "results": results, **jobs}
    out["ok"] = (out["without_result"] == 0 and out["with_several"] == 0 and out["unfinished"] == 0
                 and out["results"] == out["items"] and out["miscounted"] == 0 and out["not_completed"] == 0)
    return out


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]


def route_rows(api: ApiResult) -> list[dict]:
    rows = []
    for route in (*ROUTES, "all"):
        samples = [s for s in api.samples if route in ("all", s.route)]
        ms = [s.latency * 1000 for s in samples]
        service = [s.service * 1000 for s in samples if s.status]
        rows.append({"route": route, "requests": len(samples),
                     "non_2xx": sum(s.status not in (200, 202) for s in samples),
                     "req_s": len(samples) / api.wall_s if api.wall_s else 0.0,
                     "p50": percentile(ms, 50), "p90": percentile(ms, 90), "p99": percentile(ms, 99),
                     "max": max(ms) if ms else float("nan"), "p99_service": percentile(service, 99)})
    return rows


def report(args, api: ApiResult, work: WorkerResult, check: dict, elapsed: float) -> str:
    rows = route_rows(api)
    goal = all(r["p99"] < 200 for r in rows if r["route"] != "all")
    load = os.getloadavg()
    lines = [
        "# Load test (bench/load.py)", "",
        f"`python -m bench.load --rate {args.rate:g} --duration {args.duration:g} --items {args.items} "
        f"--max-new-tokens {args.max_new_tokens} --batch-size {args.batch_size}` on {time.strftime('%Y-%m-%d %H:%M')}"
        f" UTC, {os.cpu_count()} CPU cores (load average at the end {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}); "
        f"target `{args.target}`; gunicorn {os.environ.get('API_WORKERS', '2')} workers x "
        f"{os.environ.get('API_THREADS', '8')} threads, Postgres and Redis on the same machine. Everything on "
        f"loopback; total run {elapsed:.0f} s.", "",
        "## API: mixed submit / poll, open loop", "",
        f"After {args.warmup:g} s of unmeasured warm-up at the same rate, "
        f"{api.scheduled} requests scheduled at {args.rate:g}/s for {args.duration:g} s (25% submit of a one-item "
        f"job, 65% job status, 10% results page); {len(api.samples)} completed in {api.wall_s:.1f} s. No worker ran "
        "during this phase. Latency in ms, from the scheduled send time (so queueing behind a slow request "
        "counts); `P99 service` is from the actual send.", "",
        "| route | requests | non-2xx | req/s | P50 | P90 | P99 | max | P99 service |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(f"| {r['route']} | {r['requests']} | {r['non_2xx']} | {r['req_s']:.1f} | {r['p50']:.1f} | "
                     f"{r['p90']:.1f} | {r['p99']:.1f} | {r['max']:.1f} | {r['p99_service']:.1f} |")
    lines += ["", f"Goal P99 < 200 ms for submit and poll: **{'met' if goal else 'NOT met'}**.", "",
              "## Workers: one large job", "",
              f"A {args.items}-item job (`max_new_tokens={args.max_new_tokens}`) submitted in one request "
              f"({work.submit_s:.1f} s for validation, {args.items} item rows and {args.items} queue messages), then "
              f"one worker (prefork, concurrency 1, `BATCH_SIZE={args.batch_size}`, started in {work.startup_s:.1f} "
              "s) decoded it together with the API phase's one-item jobs.", "",
              "| items decoded | seconds | items/s |", "| ---: | ---: | ---: |",
              f"| {work.items} | {work.wall_s:.1f} | {work.items / work.wall_s if work.wall_s else 0:.1f} |", "",
              "## Exactly once", "",
              f"Every item of every job (`{check['items']}` items in `{check['jobs']}` jobs): "
              f"`{check['results']}` result rows; items without a result: `{check['without_result']}`; items with "
              f"more than one: `{check['with_several']}`; unfinished: `{check['unfinished']}`; failed: "
              f"`{check['failed']}`; jobs whose counters disagree with their items: `{check['miscounted']}`; jobs "
              f"not `completed`: `{check['not_completed']}`; most deliveries of one item: `{check['max_attempts']}`."
              f" **{'OK' if check['ok'] else 'FAILED'}**.", ""]
    return "\n".join(lines)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=200.0, help="API requests per second (default 200)")
    parser.add_argument("--duration", type=float, default=30.0, help="seconds of API load (default 30)")
    parser.add_argument("--items", type=int, default=10_000, help="items of the large job (default 10000)")
    parser.add_argument("--max-new-tokens", type=int, default=1, help="per item (default 1: the queue, not decode)")
    parser.add_argument("--batch-size", type=int, default=32, help="worker BATCH_SIZE (default 32)")
    parser.add_argument("--target", default=os.environ.get("EAGLE3_TARGET", "tiny"))
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds of load before measuring (default 2)")
    parser.add_argument("--threads", type=int, default=32, help="client threads (default 32)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="most seconds for the worker phase")
    parser.add_argument("--database-url", default=os.environ.get(
        "DATABASE_URL", "postgresql+psycopg://root@127.0.0.1:5432/test"),
        help="any database on the Postgres server to use; the run creates and drops its own")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "load.md")
    parser.add_argument("--logs", type=Path, default=ROOT / "runs" / "load")
    parser.add_argument("--keep", action="store_true", help="keep the run's database")
    args = parser.parse_args(argv)

    began = time.perf_counter()
    services = Services(args.database_url, args.target, args.batch_size, args.logs, args.keep)
    try:
        log(f"database {services.db_name}, queue {services.queue}, logs in {args.logs}")
        services.create_database()
        auth = services.create_key()
        services.start_api()
        log(f"gunicorn on 127.0.0.1:{services.port}; API phase: {args.rate:g} req/s for {args.duration:g} s")
        api = api_phase(services.port, args.rate, args.duration, args.max_new_tokens, args.threads, auth, args.warmup)
        work = worker_phase(services, args.items, args.max_new_tokens, args.timeout, auth)
        check = exactly_once(services.url)
    finally:
        services.stop()
    text_ = report(args, api, work, check, time.perf_counter() - began)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text_)
    print(text_)
    log(f"wrote {args.out}")
    return {"routes": route_rows(api), "items_per_s": work.items / work.wall_s if work.wall_s else 0.0,
            "check": check}


if __name__ == "__main__":
    result = main()
    sys.exit(0 if result["check"]["ok"] else 1)

"""Configuration from environment variables, with local-development defaults."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import cache


def _env(name: str, default, cast=str):
    raw = os.environ.get(name)
    return default if raw in (None, "") else cast(raw)


@dataclass(frozen=True)
class Settings:
    database_url: str = field(default_factory=lambda: _env("DATABASE_URL", "postgresql+psycopg://root@127.0.0.1:5432/test"))
    redis_url: str = field(default_factory=lambda: _env("REDIS_URL", "redis://127.0.0.1:6379/0"))
    target: str = field(default_factory=lambda: _env("EAGLE3_TARGET", "smollm2-135m-instruct"))
    # Celery queue of the batch task; tests use a unique one per session.
    queue: str = field(default_factory=lambda: _env("CELERY_QUEUE", "eagle3-batch"))
    # Items a worker decodes together (celery-batches flush_every and SpeculativeDecoder batch_size).
    batch_size: int = field(default_factory=lambda: _env("BATCH_SIZE", 8, int))
    # Who proposes the draft trees (eagle3/drafters): eagle (the head), suffix (text the job already holds: its
    # prompts and earlier outputs), or hybrid (both).
    drafter: str = field(default_factory=lambda: _env("DRAFTER", "eagle"))
    # Seconds a partial batch waits for more items before it is decoded anyway.
    flush_interval: float = field(default_factory=lambda: _env("BATCH_FLUSH_INTERVAL", 0.5, float))
    # Redis redelivers an unacked message after this many seconds. A message can sit unacked for about two batch
    # decodes (prefetch = 2 x batch_size: the running batch and the next one), so keep it above
    # 2 x BATCH_TIME_LIMIT_S + BATCH_FLUSH_INTERVAL. See README "Reliability".
    visibility_timeout: int = field(default_factory=lambda: _env("BROKER_VISIBILITY_TIMEOUT", 7200, int))
    # Soft limit of one batch task, hard limit + 60 s (prefork pool only).
    batch_time_limit: int = field(default_factory=lambda: _env("BATCH_TIME_LIMIT_S", 3000, int))
    # Deliveries of one item before it is failed (a batch that always kills its worker is not retried forever).
    max_attempts: int = field(default_factory=lambda: _env("ITEM_MAX_ATTEMPTS", 3, int))
    # With measure_baseline=true, this many items of a job are also decoded without speculation.
    baseline_sample_size: int = field(default_factory=lambda: _env("BASELINE_SAMPLE_SIZE", 8, int))
    max_items_per_job: int = field(default_factory=lambda: _env("MAX_ITEMS_PER_JOB", 50_000, int))
    max_request_bytes: int = field(default_factory=lambda: _env("MAX_REQUEST_BYTES", 100 * 1024 * 1024, int))
    max_new_tokens_limit: int = field(default_factory=lambda: _env("MAX_NEW_TOKENS_LIMIT", 1024, int))
    # Reconciler (beat, every RECONCILE_INTERVAL_S): an item `queued` in Postgres for RECONCILE_AFTER_S since it was
    # last sent, whose message is neither waiting in Redis nor delivered-unacked there, was lost (e.g. Redis restarted
    # without persistence) and is sent again. See jobs/reconcile.py.
    reconcile_interval_s: float = field(default_factory=lambda: _env("RECONCILE_INTERVAL_S", 60.0, float))
    reconcile_after_s: float = field(default_factory=lambda: _env("RECONCILE_AFTER_S", 60.0, float))
    # A worker leases the items it holds (prefetched or being decoded) for LEASE_S and renews the leases every
    # LEASE_S / 4 from a heartbeat thread; at the same pace it re-sends the items whose lease expired (their worker
    # is dead or stopped). A dead worker's items are therefore back on the queue within about 1.25 x LEASE_S.
    lease_s: float = field(default_factory=lambda: _env("LEASE_S", 60.0, float))
    # A worker retries writing a decoded batch's results this long while Postgres is unreachable, before it hands the
    # items back to the queue (with a growing delay) instead.
    db_retry_s: float = field(default_factory=lambda: _env("DB_RETRY_S", 60.0, float))
    # POST /generate waits this long for its item before answering 504 with the job id.
    generate_timeout_s: float = field(default_factory=lambda: _env("GENERATE_TIMEOUT_S", 60.0, float))

    # Rate limits (Flask-Limiter, stored in Redis so every gunicorn worker shares them): per API key, or per client
    # IP for calls without a valid key. A limits string: "600/minute", "10/second;600/minute", ...
    rate_limit: str = field(default_factory=lambda: _env("RATE_LIMIT", "600/minute"))
    rate_limit_unauthenticated: str = field(default_factory=lambda: _env("RATE_LIMIT_UNAUTHENTICATED", "60/minute"))
    rate_limit_storage_uri: str = field(default_factory=lambda: _env("RATE_LIMIT_STORAGE_URI", "") or
                                        _env("REDIS_URL", "redis://127.0.0.1:6379/0"))
    rate_limit_key_prefix: str = field(default_factory=lambda: _env("RATE_LIMIT_KEY_PREFIX", "eagle3-rl"))
    # A key's queued + running items at most; a submission that would pass it is 429.
    max_queued_items_per_key: int = field(default_factory=lambda: _env("MAX_QUEUED_ITEMS_PER_KEY", 100_000, int))
    quota_retry_after_s: int = field(default_factory=lambda: _env("QUOTA_RETRY_AFTER_S", 60, int))

    # /v1/files: the bytes go to this directory ("" = in Postgres), one file per id; the API and the worker (beat's
    # sweep) must see the same directory. Input files expire this long after upload (0 = never); output and error
    # files after 30 days. Beat deletes expired files every FILES_SWEEP_INTERVAL_S (jobs/files.py).
    files_dir: str = field(default_factory=lambda: _env("FILES_DIR", ""))
    input_file_retention_s: int = field(default_factory=lambda: _env("INPUT_FILE_RETENTION_S", 30 * 86400, int))
    files_sweep_interval_s: float = field(default_factory=lambda: _env("FILES_SWEEP_INTERVAL_S", 3600.0, float))

    # Schedules with a file item source read JSONL files under this directory only ("" = file sources disabled).
    schedule_input_dir: str = field(default_factory=lambda: _env("SCHEDULE_INPUT_DIR", ""))
    # Workload adaptation (eagle3/adapt.py): beat sends worker.adapt_head on this 5-field cron (UTC; "" = never,
    # e.g. "0 3 * * *" nightly) to the `<queue>.adapt` queue, to fine-tune the draft head on the last ADAPT_LAST
    # completed greedy items with ADAPT_STEPS optimizer steps (0: one epoch) at ADAPT_LR.
    adapt_schedule: str = field(default_factory=lambda: _env("ADAPT_SCHEDULE", ""))
    adapt_last: int = field(default_factory=lambda: _env("ADAPT_LAST", 500, int))
    adapt_steps: int = field(default_factory=lambda: _env("ADAPT_STEPS", 0, int))
    adapt_lr: float = field(default_factory=lambda: _env("ADAPT_LR", 1e-4, float))
    # Workers serve Prometheus metrics on this port (0 = off).
    worker_metrics_port: int = field(default_factory=lambda: _env("WORKER_METRICS_PORT", 9808, int))


@cache
def get_settings() -> Settings:
    return Settings()

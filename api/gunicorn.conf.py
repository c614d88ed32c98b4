# Threads, not sync workers: POST /generate holds its request while the queue serves it.
import os

bind = f"0.0.0.0:{os.environ.get('PORT', '8080')}"
workers = int(os.environ.get("API_WORKERS", "2"))
worker_class = "gthread"
threads = int(os.environ.get("API_THREADS", "8"))
# The first POST of a process loads the target's tokenizer (with the model: see README); leave it time.
timeout = 120
accesslog = "-"

# Prometheus multiprocess mode: every gunicorn worker writes its metrics under this directory and /metrics adds them
# up (api/metrics.py). Emptied at start; a dead worker's live gauges are dropped in child_exit.
import shutil  # noqa: E402
import tempfile  # noqa: E402

_metrics_dir = os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR",
                                     os.path.join(tempfile.gettempdir(), f"eagle3-api-metrics-{bind.rsplit(':', 1)[1]}"))
shutil.rmtree(_metrics_dir, ignore_errors=True)
os.makedirs(_metrics_dir, exist_ok=True)


# gunicorn answers what it rejects before the app sees it (a request line over limit_request_line: 414; headers too
# large: 431; a malformed request: 400) with an HTML page. Write those as RFC 9457 problems, like every other error
# of this API. The limits themselves stay: they bound what a client can make a worker read.
import json  # noqa: E402

from gunicorn import util  # noqa: E402


def _write_problem(sock, status_int, reason, mesg):
    body = json.dumps({"type": "about:blank", "title": reason, "status": status_int, "detail": mesg}).encode()
    head = (f"HTTP/1.1 {status_int} {reason}\r\nConnection: close\r\nContent-Type: application/problem+json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n")
    util.write_nonblock(sock, head.encode("latin-1") + body)


util.write_error = _write_problem


def child_exit(server, worker):
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)


def post_worker_init(worker):
    """Load the target's tokenizer (to count prompt tokens) before the first request, not during it."""
    from jobs import tokenizer
    from jobs.config import get_settings

    tokenizer.load(get_settings().target)

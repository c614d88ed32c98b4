# Threads, not sync workers: POST /generate holds its request while the queue serves it.
import os

bind = f"0.0.0.0:{os.environ.get('PORT', '8080')}"
workers = int(os.environ.get("API_WORKERS", "2"))
worker_class = "gthread"
threads = int(os.environ.get("API_THREADS", "8"))
# The first POST of a process loads the target's tokenizer (with the model: see README); leave it time.
timeout = 120
accesslog = "-"


def post_worker_init(worker):
    """Load the target's tokenizer (to count prompt tokens) before the first request, not during it."""
    from api.limits import target
    from jobs.config import get_settings

    target(get_settings().target)

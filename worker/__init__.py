"""The Celery worker: `celery -A worker worker -Q $CELERY_QUEUE,$CELERY_QUEUE.maint --pool=prefork -c 1`."""
from jobs.queue import celery_app as app

from . import tasks  # noqa: F401  (registers the tasks on app)

__all__ = ["app"]

"""One logging setup for the API and the workers: JSON lines on stderr (LOG_FORMAT=text for plain lines).

Every record becomes {"ts", "level", "logger", "message", ...} plus the fields passed with `extra=`, such as
`job_id`, `job_ids`, `schedule_id` or `items`, so log lines can be filtered by job.
"""
from __future__ import annotations

import json
import logging
import os
import sys
from datetime import datetime, timezone

_RESERVED = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {"ts": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
               "level": record.levelname, "logger": record.name, "message": record.getMessage()}
        for key, value in record.__dict__.items():
            if key not in _RESERVED and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def configure_logging(level: str | None = None, fmt: str | None = None) -> None:
    """Replace the root logger's handlers with one stderr handler (idempotent)."""
    fmt = (fmt or os.environ.get("LOG_FORMAT") or "json").lower()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else
                         logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    for old in list(root.handlers):
        if getattr(old, "_eagle3", False):
            root.removeHandler(old)
    handler._eagle3 = True
    root.addHandler(handler)
    root.setLevel(level or os.environ.get("LOG_LEVEL") or "INFO")

"""Leases on the items a worker holds, so that a dead or stopped worker's items come back within about a minute
instead of after the broker's visibility timeout (2 hours by default).

A worker holds an item from the moment its message is prefetched until the message is acked: buffered by
celery-batches, waiting for its delivery time (a delayed hand-back), or in the batch being decoded. A heartbeat
thread in the worker's main process leases every item it holds for LEASE_S and renews the leases every LEASE_S / 4;
it also wakes when a message arrives, so a new item is leased at once. A pool child claims and writes its items
under the same owner (the child inherits OWNER), and a result is written only while the item is still leased to it.

When the worker dies (SIGKILL of the whole worker, a lost machine) or is stopped (SIGSTOP), its leases expire, and
the next heartbeat of any worker re-sends those items (jobs.reconcile.requeue_expired). A stopped worker that resumes
finds its items claimed by another worker, and its late results are discarded (jobs.lifecycle.record).
"""
from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
from typing import Callable

from jobs import lifecycle
from jobs.reconcile import requeue_expired

log = logging.getLogger(__name__)
# This worker (its main process); set at import, before the pool forks, so the children share it.
OWNER = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


class Heartbeat:
    """Renew the leases of the items `held()` returns, and re-send the items whose lease expired, every
    `lease_s / 4` seconds, or soon after wake()."""

    def __init__(self, Session, celery, held: Callable[[], set[int]], lease_s: float):
        self.Session, self.celery, self.held, self.lease_s = Session, celery, held, lease_s
        self.every_s = lease_s / 4
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lease-heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()
        log.info("lease heartbeat: owner %s, lease %.1f s, renewed every %.1f s", OWNER, self.lease_s, self.every_s)

    def wake(self) -> None:
        self._wake.set()

    def beat(self) -> tuple[int, int]:
        """One round: (items leased, items re-sent)."""
        ids = sorted(self.held())
        leased = 0
        if ids:
            with self.Session.begin() as session:
                leased = lifecycle.renew(session, ids, OWNER, self.lease_s)
        return leased, requeue_expired(self.Session, self.celery)

    def _run(self) -> None:
        while True:
            if self._wake.wait(self.every_s):
                time.sleep(0.2)  # let a burst of arriving messages gather into one round
                self._wake.clear()
            try:
                self.beat()
            except Exception as exc:  # noqa: BLE001 - Postgres or Redis down: the next round tries again
                log.warning("lease heartbeat failed: %s: %s", exc.__class__.__name__, exc)

"""Private infrastructure for the fault tests, so that a test can restart or cut off a service without touching the
shared Postgres and Redis that other test sessions (and CI) use on the same machine:

- `RedisServer`: a redis-server of our own on a free loopback port, without persistence (`--save '' --appendonly
  no`), like the shared one: a restart forgets every message. `restart()` relaunches the same command line.
- `private_database()`: a database of our own on the shared Postgres server, at Alembic head, dropped afterwards.
- `TcpProxy`: a loopback TCP proxy in front of Postgres. `cut()` closes every proxied connection and refuses new
  ones (the listening socket is closed, so connects fail at once with ECONNREFUSED, as with a stopped server);
  `restore()` listens again on the same port. That is a Postgres outage as the worker sees it, without stopping
  the server everybody shares (a private cluster would need initdb as a non-root user; the proxy needs nothing).
"""
from __future__ import annotations

import contextlib
import os
import selectors
import socket
import subprocess
import threading
import time
from pathlib import Path

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class RedisServer:
    def __init__(self, workdir: Path):
        self.port, self.workdir = free_port(), workdir
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen | None = None
        self.start()

    def start(self, timeout: float = 10.0) -> None:
        self.log = open(self.workdir / "redis.log", "ab")
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self.workdir), "--daemonize", "no"], stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while not self.ping():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server on :{self.port} did not start")
            time.sleep(0.05)

    def ping(self) -> bool:
        import redis

        try:
            return bool(redis.Redis(port=self.port, socket_timeout=0.5).ping())
        except redis.RedisError:
            return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()  # SIGTERM: redis exits at once; with --save '' it writes nothing
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        self.log.close()

    def restart(self) -> None:
        self.stop()
        self.start()

    def client(self):
        import redis

        return redis.Redis(port=self.port)


@contextlib.contextmanager
def private_database(suffix: str):
    """A fresh database next to the session's, at Alembic head. Yields its URL."""
    from alembic import command
    from alembic.config import Config

    session_url = make_url(os.environ["DATABASE_URL"])
    name = f"{session_url.database}_{suffix}"
    url = session_url.set(database=name).render_as_string(hide_password=False)
    admin = create_engine(session_url.set(database="postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        config = Config(str(ROOT / "alembic.ini"))
        config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
        command.upgrade(config, "head")
        yield url
    finally:
        from jobs.db import get_engine

        get_engine(url).dispose()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


class TcpProxy:
    """127.0.0.1:<port> -> target, one thread with a selector; cut() and restore() switch it off and on."""

    def __init__(self, target_host: str, target_port: int):
        self.target = (target_host, target_port)
        self.port = free_port()
        self._sel = selectors.DefaultSelector()
        self._peer: dict[socket.socket, socket.socket] = {}
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._stop = False
        self._wake_r, self._wake_w = socket.socketpair()
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self.restore()
        self._thread = threading.Thread(target=self._run, name="tcp-proxy", daemon=True)
        self._thread.start()

    def _wake(self) -> None:
        self._wake_w.send(b"x")

    def restore(self) -> None:
        with self._lock:
            if self._listener is None:
                listener = socket.socket()
                listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                listener.bind(("127.0.0.1", self.port))
                listener.listen(64)
                listener.setblocking(False)
                self._listener = listener
                self._sel.register(listener, selectors.EVENT_READ, "accept")
        self._wake()

    def cut(self) -> None:
        """Close every proxied connection and the listening socket: new connects are refused until restore()."""
        with self._lock:
            if self._listener is not None:
                self._sel.unregister(self._listener)
                self._listener.close()
                self._listener = None
            for sock in list(self._peer):
                self._close(sock)
        self._wake()

    def close(self) -> None:
        self.cut()
        self._stop = True
        self._wake()
        self._thread.join(timeout=5)

    def _close(self, sock: socket.socket) -> None:
        peer = self._peer.pop(sock, None)
        for s in (sock, peer):
            if s is None:
                continue
            self._peer.pop(s, None)
            with contextlib.suppress(KeyError, ValueError):
                self._sel.unregister(s)
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def _run(self) -> None:
        while not self._stop:
            for key, _ in self._sel.select(timeout=0.5):
                with self._lock:
                    if key.data == "wake":
                        key.fileobj.recv(4096)
                    elif key.data == "accept":
                        if key.fileobj is not self._listener:
                            continue
                        try:
                            client, _ = self._listener.accept()
                        except OSError:
                            continue
                        try:
                            upstream = socket.create_connection(self.target, timeout=5)
                        except OSError:
                            client.close()
                            continue
                        for a, b in ((client, upstream), (upstream, client)):
                            a.setblocking(False)
                            self._peer[a] = b
                            self._sel.register(a, selectors.EVENT_READ, "pipe")
                    elif key.fileobj in self._peer:
                        sock = key.fileobj
                        try:
                            data = sock.recv(65536)
                            if data:
                                self._peer[sock].setblocking(True)
                                self._peer[sock].sendall(data)
                                self._peer[sock].setblocking(False)
                                continue
                        except OSError:
                            pass
                        self._close(sock)

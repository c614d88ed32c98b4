"""What gunicorn itself rejects, before the app sees it, is a problem+json too: a URL longer than its request-line
limit (414), headers too large (431), a malformed request line (400). Run against gunicorn with the project's
config (api/gunicorn.conf.py) on a free loopback port."""
import json
import os
import socket
import subprocess
import sys
import time

import pytest
from conftest import ROOT
from fault_helpers import free_port


@pytest.fixture(scope="module")
def server(database, tmp_path_factory):
    port = free_port()
    log = open(tmp_path_factory.mktemp("gunicorn") / "gunicorn.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "gunicorn", "-c", "api/gunicorn.conf.py", "--bind",
                             f"127.0.0.1:{port}", "--workers", "1", "api.wsgi:app"], cwd=ROOT,
                            env={**os.environ, "PORT": str(port)}, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while raw(port, b"GET /openapi.json HTTP/1.1\r\nHost: t\r\n\r\n")[0] != 200:
            assert proc.poll() is None and time.monotonic() < deadline, "gunicorn did not start"
            time.sleep(0.2)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        log.close()


def raw(port: int, request: bytes) -> tuple[int, dict, bytes]:
    """Send bytes, read the whole answer (gunicorn closes after an error): (status, headers, body); 0 if refused."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(request)
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
                head, _, body = data.partition(b"\r\n\r\n")
                headers = dict(line.split(": ", 1) for line in head.decode("latin-1").split("\r\n")[1:] if ": " in line)
                if "Content-Length" in headers and len(body) >= int(headers["Content-Length"]):
                    break
    except OSError:
        return 0, {}, b""
    return int(head.split(b" ")[1]), headers, body


@pytest.mark.parametrize("length", [5_000, 100_000])
def test_a_url_too_long_is_a_414_problem(server, length):
    status, headers, body = raw(server, b"GET /v1/jobs?after=" + b"a" * length + b" HTTP/1.1\r\nHost: t\r\n\r\n")
    assert status == 414 and headers["Content-Type"] == "application/problem+json", (status, headers, body[:200])
    problem = json.loads(body)
    assert problem["status"] == 414 and problem["title"] == "URI Too Long" and problem["type"] == "about:blank"


def test_other_requests_gunicorn_rejects_are_problems(server):
    huge_header = b"GET /health HTTP/1.1\r\nHost: t\r\nX-Big: " + b"b" * 20_000 + b"\r\n\r\n"
    for request, expected in ((b"NOT A REQUEST\r\n\r\n", 400), (huge_header, 431)):
        status, headers, body = raw(server, request)
        assert status == expected and headers["Content-Type"] == "application/problem+json", (status, body[:200])
        assert json.loads(body)["status"] == expected


def test_a_url_under_the_limit_reaches_the_app(server):
    status, headers, body = raw(server, b"GET /v1/jobs?after=" + b"a" * 3000 + b" HTTP/1.1\r\nHost: t\r\n\r\n")
    assert status == 401 and headers["Content-Type"] == "application/problem+json"  # the app's own answer

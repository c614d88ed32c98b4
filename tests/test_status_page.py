"""The status page GET /: sign-in (form or ?key=, HttpOnly cookie), only the key's own jobs, and a real headless
Chromium rendering it (DOM rows and a screenshot). Chromium is required: .ci/run installs it."""
import shutil
import struct
import subprocess

import pytest
from conftest import RUN_ID, client_for, make_key, prompts, serving, submit, wait_for

from api import create_app

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-background-networking", "--disable-gpu",
                  "--disable-dev-shm-usage", "--no-first-run", "--hide-scrollbars"]


def test_login_cookie_and_isolation(app, anon_client):
    key, other_key = make_key("page"), make_key("page-other")
    idle = create_app({"queue": f"page-idle-{RUN_ID}"})
    mine = submit(client_for(idle, key), {"items": prompts(2, "Mine")})
    theirs = submit(client_for(idle, other_key), {"items": prompts(1, "Theirs")})

    form = anon_client.get("/")
    assert form.status_code == 200 and b'<form method="post" action="/login">' in form.data
    assert mine["id"].encode() not in form.data
    assert anon_client.post("/login", data={"key": "e3k_wrong"}).status_code == 401
    assert anon_client.post("/login", data={}).status_code == 200  # just the form again

    response = anon_client.post("/login", data={"key": key})
    assert response.status_code == 303 and response.headers["Location"] == "/"
    cookie = response.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/" in cookie
    page = anon_client.get("/")
    assert page.status_code == 200 and page.mimetype == "text/html"
    assert "default-src 'none'" in page.headers["Content-Security-Policy"]
    html = page.get_data(as_text=True)
    assert f'data-job-id="{mine["id"]}"' in html and theirs["id"] not in html
    # The cookie is for the page only: the JSON API still wants a Bearer key.
    assert anon_client.get("/v1/jobs").status_code == 401
    assert anon_client.post("/logout").status_code == 303
    assert b"/login" in anon_client.get("/").data
    for job, k in ((mine, key), (theirs, other_key)):
        client_for(idle, k).post(f"/v1/jobs/{job['id']}/cancel")


@pytest.fixture
def live_server(app):
    with serving(app) as url:
        yield url


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if path is None:  # fail, not skip: the page must be proven to render
        pytest.fail("chromium is not installed: apt-get install -y chromium chromium-driver (.ci/run does this)")
    return path


def run_chromium(tmp_path, *args) -> subprocess.CompletedProcess:
    return subprocess.run([chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}", *args],
                          capture_output=True, text=True, timeout=90)


def test_status_page_in_headless_chromium(worker, live_server, tmp_path):
    key = make_key("browser")
    api = client_for(create_app(), key)
    jobs = [submit(api, {"items": prompts(n, f"Browser {n}"), "params": {"max_new_tokens": 6}}) for n in (2, 3)]
    for job in jobs:
        wait_for(api, job["id"])
    url = f"{live_server}/?key={key}"  # signs in (cookie) and redirects to /

    dom = run_chromium(tmp_path, "--dump-dom", url)
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    for job in jobs:
        assert f'data-job-id="{job["id"]}" data-status="completed"' in html, html[:3000]
    assert html.count('class="job-row"') == 2
    assert '<svg id="chart"' in html and html.count('class="bar tau"') == 2
    assert html.count('class="bar speedup"') == 2

    shot = tmp_path / "status.png"  # kept under the test's tmp dir (pytest keeps the last 3 runs)
    result = run_chromium(tmp_path, f"--screenshot={shot}", "--window-size=1100,700", url)
    assert result.returncode == 0 and shot.exists(), result.stderr[-2000:]
    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", png[16:24])
    assert (width, height) == (1100, 700)
    assert len(png) > 15_000, len(png)  # a blank page compresses to a few KB; the table and chart do not

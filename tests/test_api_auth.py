"""API keys: every /v1 route needs a valid Bearer key, keys are stored hashed, and a key sees only its own jobs."""
import hashlib
import os
import subprocess
import sys

import pytest
from conftest import ROOT, RUN_ID, all_results, client_for, make_key, prompts, submit, wait_for
from sqlalchemy import select, text

from api import create_app
from jobs.db import session_factory
from jobs.models import ApiKey, Job

ROUTES = [("get", "/v1/jobs"), ("post", "/v1/jobs"), ("get", "/v1/jobs/00000000-0000-0000-0000-000000000000"),
          ("get", "/v1/jobs/00000000-0000-0000-0000-000000000000/results"),
          ("post", "/v1/jobs/00000000-0000-0000-0000-000000000000/cancel"), ("post", "/generate"),
          ("get", "/v1/schedules"), ("post", "/v1/schedules")]


@pytest.fixture(scope="module")
def idle_app(database):
    return create_app({"queue": f"auth-idle-{RUN_ID}"})  # no worker consumes it: jobs stay queued


@pytest.mark.parametrize("method,path", ROUTES)
def test_every_v1_route_needs_a_key(anon_client, method, path):
    response = getattr(anon_client, method)(path, json={"items": [{"prompt": "x"}]})
    assert response.status_code == 401 and response.mimetype == "application/problem+json"
    assert response.headers["WWW-Authenticate"].startswith("Bearer")
    bad = getattr(anon_client, method)(path, json={}, headers={"Authorization": "Bearer e3k_not-a-real-key"})
    assert bad.status_code == 401 and 'error="invalid_token"' in bad.headers["WWW-Authenticate"]
    assert getattr(anon_client, method)(path, headers={"Authorization": "Basic Zm9vOmJhcg=="}).status_code == 401


def test_open_endpoints_reveal_no_jobs(anon_client, client):
    job = submit(client, {"items": prompts(1, "Secret topic"), "params": {"max_new_tokens": 2}})
    for path in ("/health", "/openapi.json", "/metrics"):
        response = anon_client.get(path)
        assert response.status_code in (200, 503)
        assert job["id"] not in response.get_data(as_text=True)


def test_a_second_key_cannot_see_or_touch_the_first_keys_jobs(idle_app):
    owner, other = client_for(idle_app, make_key("owner")), client_for(idle_app, make_key("other"))
    job = submit(owner, {"items": prompts(2, "Owned"), "params": {"max_new_tokens": 2}})
    path = f"/v1/jobs/{job['id']}"
    for response in (other.get(path), other.get(path + "/results"), other.get(path + "/results?format=jsonl"),
                     other.post(path + "/cancel")):
        assert response.status_code == 404 and response.mimetype == "application/problem+json"
        assert response.get_json()["detail"] == f"no job {job['id']!r}"  # the same answer as for a missing job
    assert job["id"] not in [j["id"] for j in other.get("/v1/jobs?limit=100").get_json()["data"]]
    assert owner.get(path).get_json()["status"] == "queued"  # the other key's cancel did nothing
    assert [j["id"] for j in owner.get("/v1/jobs").get_json()["data"]] == [job["id"]]
    assert owner.post(path + "/cancel").get_json()["status"] == "cancelled"


def test_other_key_gets_404_on_finished_results(client, worker, app):
    job = submit(client, {"items": prompts(1, "Finished"), "params": {"max_new_tokens": 2}})
    wait_for(client, job["id"])
    assert len(all_results(client, job["id"])) == 1
    other = client_for(app, make_key("other"))
    assert other.get(f"/v1/jobs/{job['id']}/results?format=jsonl").status_code == 404
    assert other.get(f"/v1/jobs/{job['id']}").status_code == 404


def test_idempotency_keys_are_per_api_key(idle_app):
    a, b = client_for(idle_app, make_key("a")), client_for(idle_app, make_key("b"))
    headers = {"Idempotency-Key": f"shared-{RUN_ID}"}
    first = submit(a, {"items": prompts(1, "A")}, headers)
    second = submit(b, {"items": prompts(1, "B different body")}, headers)  # no 409, no replay of a's job
    assert first["id"] != second["id"]
    for c, j in ((a, first), (b, second)):
        c.post(f"/v1/jobs/{j['id']}/cancel")


def test_jobs_without_an_owner_are_visible_to_no_key(client, database):
    with session_factory(database).begin() as session:
        legacy = Job(type="generation", params={}, metadata_={}, total_items=0)
        session.add(legacy)
        session.flush()
        legacy_id = str(legacy.id)
    assert client.get(f"/v1/jobs/{legacy_id}").status_code == 404
    assert legacy_id not in [j["id"] for j in client.get("/v1/jobs?limit=100").get_json()["data"]]


def cli(*args):
    return subprocess.run([sys.executable, "-m", "api.keys", *args], cwd=ROOT, env=os.environ, capture_output=True,
                          text=True, timeout=60)


def test_cli_creates_lists_and_revokes_keys_stored_hashed(anon_client, database):
    created = cli("create", "--name", f"cli-{RUN_ID}")
    assert created.returncode == 0, created.stderr
    key = created.stdout.strip()
    assert key.startswith("e3k_") and len(key) > 40
    with session_factory(database)() as session:
        row = session.scalar(select(ApiKey).where(ApiKey.name == f"cli-{RUN_ID}"))
        assert row.key_hash == hashlib.sha256(key.encode()).hexdigest() and key.startswith(row.prefix)
        dump = session.execute(text("SELECT string_agg(t::text, ' ') FROM api_keys t")).scalar()
        assert key not in dump and key[len(row.prefix):] not in dump  # never stored in plaintext
    assert anon_client.get("/v1/jobs", headers={"Authorization": f"Bearer {key}"}).status_code == 200
    listed = cli("list")
    assert listed.returncode == 0 and f"{row.prefix}...\tcli-{RUN_ID}" in listed.stdout and key not in listed.stdout
    revoked = cli("revoke", str(row.id))
    assert revoked.returncode == 0, revoked.stderr
    assert anon_client.get("/v1/jobs", headers={"Authorization": f"Bearer {key}"}).status_code == 401
    assert cli("revoke", "e3k_nosuch").returncode == 1
    assert cli("create").returncode == 2  # --name is required

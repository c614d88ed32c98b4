"""Schemathesis against /openapi.json, in-process (WSGI), every operation with a bounded number of generated cases
(valid and invalid): no 5xx, and every response matches the spec (status code, content type, headers, body schema).

The app under test has a private database and a queue that no worker consumes, so the generated jobs are stored
and queued but never decoded, and cannot disturb other tests. Two 5xx answers are the spec's own for that setup and
are accepted only in exactly that form: `/generate` answers 504 (no worker picked its item up within the timeout;
the job keeps going) and `/health` answers 503 naming only the missing worker.

Cases come from schemathesis' own strategies (positive and negative generation), driven by Hypothesis here rather
than by schemathesis' pytest plugin, whose fixture-based loader does not work with pytest 9.

Examples per operation: SCHEMATHESIS_EXAMPLES (default 25). Runs are derandomized (the same cases every run, so CI
does not flake); set SCHEMATHESIS_RANDOM=1 for a fresh exploration.
"""
from __future__ import annotations

import io
import json
import os

import pytest
import schemathesis
from conftest import RUN_ID, app_key, client_for
from fault_helpers import private_database
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.checks import (content_type_conformance, not_a_server_error, response_headers_conformance,
                                 response_schema_conformance, status_code_conformance)

from sqlalchemy import select

from api import create_app
from api.openapi import spec
from jobs import lifecycle
from jobs.lifecycle import Outcome
from jobs.models import Item

EXAMPLES = int(os.environ.get("SCHEMATHESIS_EXAMPLES", "25"))
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_headers_conformance,
          response_schema_conformance]


@pytest.fixture(scope="module")
def fuzzed_app(database):
    with private_database("st") as url:
        yield create_app({"database_url": url, "queue": f"schemathesis-{RUN_ID}", "generate_timeout_s": 0.05})


@pytest.fixture(scope="module")
def api_schema(fuzzed_app):
    return schemathesis.openapi.from_wsgi("/openapi.json", fuzzed_app)


@pytest.fixture(scope="module")
def known_job(fuzzed_app) -> str:
    """A job with a completed, a failed and a queued item, so the {job_id} operations are also fuzzed on a job that
    exists (random ids only ever reach the 404s). Its results are written the way a worker writes them."""
    client = client_for(fuzzed_app)
    created = client.post("/v1/jobs", json={"items": [{"prompt": f"Known {i}"} for i in range(3)]}).get_json()
    Session = fuzzed_app.extensions["jobs"].Session
    with Session.begin() as session:
        ids = session.scalars(select(Item.id).where(Item.job_id == created["id"]).order_by(Item.idx)).all()
        lifecycle.claim(session, ids[:2], max_attempts=3)
        stats = {"new_tokens": 2, "target_forwards": 2, "rounds": 1, "accept_length": 2.0, "time_share_s": 0.1}
        lifecycle.record(session, [Outcome(ids[0], output={"text": "hi", "token_ids": [1, 2]}, stats=stats),
                                   Outcome(ids[1], error="ValueError: boom")])
    return created["id"]


@pytest.fixture(scope="module")
def known_batch(fuzzed_app) -> dict:
    """A batch input file and a batch made from it (one good line, one bad), so the {file_id} and {batch_id}
    operations are also fuzzed on objects that exist."""
    client = client_for(fuzzed_app)
    line = {"custom_id": "a", "url": "/v1/chat/completions",
            "body": {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}}
    raw = (json.dumps(line) + "\n" + json.dumps({**line, "custom_id": "b", "url": "/nope"}) + "\n").encode()
    file = client.post("/v1/files", data={"file": (io.BytesIO(raw), "in.jsonl"), "purpose": "batch"},
                       content_type="multipart/form-data").get_json()
    batch = client.post("/v1/batches", json={"input_file_id": file["id"], "endpoint": "/v1/chat/completions",
                                             "completion_window": "24h"}).get_json()
    return {"file_id": file["id"], "batch_id": batch["id"]}


@pytest.fixture
def auth_headers(fuzzed_app) -> dict:
    """The headers every generated request carries: a key of the fuzzed app's private database."""
    return {"Authorization": f"Bearer {app_key(fuzzed_app)}"}


OPERATIONS = [(path, method.upper()) for path, operations in spec()["paths"].items() for method in operations]


def expected_unavailable(case, response) -> bool:
    """The documented 5xx of an app whose queue has no worker (see the module docstring)."""
    try:
        body = response.json()
    except ValueError:
        return False
    if case.path == "/generate" and response.status_code == 504:
        return body.get("title") == "Timeout" and bool(body.get("job_id"))
    if case.path == "/health" and response.status_code == 503:
        return body.get("detail") == "failed: workers"
    return False


@pytest.mark.parametrize("path,method", OPERATIONS, ids=[f"{m} {p}" for p, m in OPERATIONS])
def test_api_matches_its_spec_and_never_fails(api_schema, known_job, known_batch, auth_headers, path, method):
    operation = api_schema[path][method]
    modes = (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE)
    strategies = [operation.as_strategy(mode) for mode in modes]
    known = {"job_id": known_job, **known_batch}
    for name, value in known.items():
        if "{" + name + "}" in path:
            strategies += [operation.as_strategy(mode, path_parameters={name: value}) for mode in modes]
    cases = st.one_of(strategies)

    @given(case=cases)
    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              derandomize=not os.environ.get("SCHEMATHESIS_RANDOM"), suppress_health_check=list(HealthCheck))
    def check(case):
        response = case.call(headers=auth_headers)
        checks = CHECKS
        if expected_unavailable(case, response):
            checks = [c for c in CHECKS if c is not not_a_server_error]
        case.validate_response(response, checks=checks)

    check()

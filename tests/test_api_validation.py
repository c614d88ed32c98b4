"""Every validation error path: 400/413/415/422 with a problem+json body naming the field; 404/405 as JSON.
No worker is needed: nothing here is accepted."""
import io
import json
import uuid

import pytest

from conftest import client_for

from api import create_app

OK_ITEM = {"custom_id": "a", "prompt": "Hello"}
PROBLEM = "application/problem+json"


def job(**fields):
    return {"items": [OK_ITEM], **fields}


def assert_problem(response, status: int, field: str | None = None, message: str | None = None) -> dict:
    body = response.get_json()
    assert response.status_code == status, body
    assert response.mimetype == PROBLEM
    assert body["status"] == status and body["title"] and body["type"] == "about:blank"
    if field is not None:
        fields = [e["field"] for e in body["errors"]]
        assert field in fields, fields
        assert body["detail"].startswith(f"{body['errors'][0]['field']}:") or body["detail"].startswith("line ")
        if message is not None:
            assert any(message in e["message"] for e in body["errors"] if e["field"] == field), body["errors"]
    return body


LONG_PROMPT = "x" * 1100  # the tiny target's byte tokenizer: > 1024 tokens of context

INVALID_JOBS = [
    ([OK_ITEM], "body", "valid dictionary"),
    ({}, "items", "required"),
    ({"items": []}, "items", "at least 1"),
    ({"items": "abc"}, "items", "valid list"),
    ({"items": [{"custom_id": "a"}]}, "items[0].prompt", "required"),
    ({"items": [{"prompt": ""}]}, "items[0].prompt", "at least 1"),
    ({"items": [{"prompt": 123}]}, "items[0].prompt", "valid string"),
    ({"items": [{"prompt": "hi", "custom_id": ""}]}, "items[0].custom_id", "at least 1"),
    ({"items": [{"prompt": "hi", "custom_id": "c" * 257}]}, "items[0].custom_id", "at most 256"),
    ({"items": [{"prompt": "hi", "temprature": 0.5}]}, "items[0].temprature", "Extra inputs"),
    ({"items": [OK_ITEM], "colour": "red"}, "colour", "Extra inputs"),
    (job(type="translate"), "type", "'generation' or 'review'"),
    (job(params={"temperature": -0.1}), "params.temperature", "greater than or equal to 0"),
    (job(params={"temperature": 2.5}), "params.temperature", "less than or equal to 2"),
    (job(params={"temperature": "hot"}), "params.temperature", "valid number"),
    (job(params={"top_p": 0}), "params.top_p", "greater than 0"),
    (job(params={"top_p": 1.5}), "params.top_p", "less than or equal to 1"),
    (job(params={"top_k": -1}), "params.top_k", "greater than or equal to 0"),
    (job(params={"max_new_tokens": 0}), "params.max_new_tokens", "greater than or equal to 1"),
    (job(params={"max_new_tokens": 1.5}), "params.max_new_tokens", "integer"),
    (job(params={"max_new_tokens": 100000}), "params.max_new_tokens", "at most 1024 on this server"),
    (job(params={"parallel_degree": 0}), "params.parallel_degree", "greater than or equal to 1"),
    (job(params={"parallel_degree": 17}), "params.parallel_degree", "less than or equal to 16"),
    (job(params={"validation_threshold": 0}), "params.validation_threshold", "greater than 0"),
    (job(params={"validation_threshold": 1.01}), "params.validation_threshold", "less than or equal to 1"),
    (job(params={"seed": -1}), "params.seed", "greater than or equal to 0"),
    (job(params={"measure_baseline": "perhaps"}), "params.measure_baseline", "valid boolean"),
    (job(params={"speed": "max"}), "params.speed", "Extra inputs"),
    (job(params=[1]), "params", "valid dictionary"),
    ({"items": [OK_ITEM, {"prompt": "b", "temperature": -1}]}, "items[1].temperature", "greater than or equal"),
    ({"items": [OK_ITEM, {"prompt": "b", "max_new_tokens": 2000}]}, "items[1].max_new_tokens", "at most 1024"),
    ({"items": [OK_ITEM, {"prompt": LONG_PROMPT}]}, "items[1].prompt", "exceeds the model's context of 1024"),
    ({"items": [{"prompt": "x" * 1000}], "params": {"max_new_tokens": 64}}, "items[0].prompt", "max_new_tokens=64"),
    ({"type": "review", "items": [{"prompt": "x" * 700}]}, "items[0].prompt", "exceeds"),  # the template counts
    ({"items": [OK_ITEM, {"custom_id": "a", "prompt": "b"}]}, "items[1].custom_id", "duplicate custom_id 'a'"),
    ({"items": [{"prompt": "a"}, {"custom_id": "0", "prompt": "b"}]}, "items[1].custom_id", "duplicate"),
    (job(priority=10), "priority", "less than or equal to 9"),
    (job(priority=-1), "priority", "greater than or equal to 0"),
    (job(priority="high"), "priority", "valid integer"),
    (job(metadata={f"k{i}": "v" for i in range(17)}), "metadata", "at most 16 keys"),
    (job(metadata={"k": "v" * 513}), "metadata", "values 512"),
    (job(metadata={"k": 1}), "metadata.k", "valid string"),
    # a review job's own label set and policy
    (job(type="review", labels=["spam"]), "labels", "at least 2"),
    (job(type="review", labels=[f"l{i}" for i in range(33)]), "labels", "at most 32"),
    (job(type="review", labels=["spam", ""]), "labels[1]", "at least 1"),
    (job(type="review", labels=["spam", "x" * 65]), "labels[1]", "at most 64"),
    (job(type="review", labels=["spam", "Spam"]), "labels", "unique"),
    (job(type="review", labels=["spam", " ok"]), "labels[1]", "whitespace"),
    (job(type="review", labels=["spam", "o\nk"]), "labels[1]", "line breaks"),
    (job(type="review", labels=["spam", 3]), "labels[1]", "valid string"),
    (job(type="review", labels="spam,ok"), "labels", "valid list"),
    (job(type="review", policy=""), "policy", "at least 1"),
    (job(type="review", policy="p" * 4001), "policy", "at most 4000"),
    (job(labels=["spam", "ok"]), "labels", "not taken by a generation job"),
    (job(policy="No spam."), "policy", "not taken by a generation job"),
    ({"type": "review", "policy": "p" * 600, "items": [{"prompt": "x" * 300}]}, "items[0].prompt", "exceeds"),
]


@pytest.mark.parametrize("body,field,message", INVALID_JOBS, ids=[f"{i}-{c[1]}" for i, c in enumerate(INVALID_JOBS)])
def test_invalid_job_is_422_naming_the_field(client, body, field, message):
    assert_problem(client.post("/v1/jobs", json=body), 422, field, message)


def test_several_errors_are_all_reported(client):
    body = {"items": [{"prompt": ""}, {"prompt": "ok", "top_p": 0}], "priority": 99}
    errors = assert_problem(client.post("/v1/jobs", json=body), 422)["errors"]
    assert {e["field"] for e in errors} == {"items[0].prompt", "items[1].top_p", "priority"}


def test_malformed_json_is_400(client):
    response = client.post("/v1/jobs", data='{"items": [', content_type="application/json")
    assert_problem(response, 400, "body", "not valid JSON")


def test_invalid_utf8_is_400(client):
    response = client.post("/v1/jobs", data=b'{"items": "\xff"}', content_type="application/json")
    assert_problem(response, 400, "body")


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", None])
def test_other_content_types_are_415(client, content_type):
    response = client.post("/v1/jobs", data=json.dumps(job()), content_type=content_type)
    assert_problem(response, 415)


def test_too_many_items_is_413(database):
    client = client_for(create_app({"max_items_per_job": 3}))
    response = client.post("/v1/jobs", json={"items": [{"prompt": f"p{i}"} for i in range(4)]})
    assert_problem(response, 413, "items", "at most 3")


def test_too_many_bytes_is_413(database):
    client = client_for(create_app({"max_request_bytes": 2000}))
    response = client.post("/v1/jobs", json={"items": [{"prompt": "x" * 3000}]})
    assert_problem(response, 413)
    upload = {"file": (io.BytesIO(b'{"prompt": "' + b"x" * 3000 + b'"}\n'), "items.jsonl")}
    assert_problem(client.post("/v1/jobs", data=upload, content_type="multipart/form-data"), 413)


def test_idempotency_key_too_long_is_422(client):
    response = client.post("/v1/jobs", json=job(), headers={"Idempotency-Key": "k" * 256})
    assert_problem(response, 422, "Idempotency-Key")


# ------------------------------------------------------------------------------------------------ JSONL upload
def upload(client, text: str | bytes | None, job_field: str | None = None, app_client=None):
    data = {}
    if text is not None:
        data["file"] = (io.BytesIO(text.encode() if isinstance(text, str) else text), "items.jsonl")
    if job_field is not None:
        data["job"] = job_field
    return (app_client or client).post("/v1/jobs", data=data, content_type="multipart/form-data")


def test_jsonl_without_file_is_422(client):
    assert_problem(upload(client, None, '{"type": "generation"}'), 422, "file", "required")


def test_jsonl_bad_line_is_400_with_line_number(client):
    body = assert_problem(upload(client, '{"prompt": "a"}\n\n{"prompt": \n'), 400, "file", "not valid JSON")
    assert body["errors"][0]["line"] == 3 and body["detail"].startswith("line 3:")


def test_jsonl_invalid_item_names_field_and_line(client):
    body = assert_problem(upload(client, '{"prompt": "a"}\n\n{"prompt": "b", "top_p": 7}\n'), 422,
                          "items[1].top_p", "less than or equal to 1")
    assert body["errors"][0]["line"] == 3


def test_jsonl_empty_file_is_422(client):
    assert_problem(upload(client, "\n\n"), 422, "items", "at least 1")


def test_jsonl_bad_job_field(client):
    assert_problem(upload(client, '{"prompt": "a"}\n', "{nope"), 400, "job", "not valid JSON")
    assert_problem(upload(client, '{"prompt": "a"}\n', '{"params": {"temperature": -1}}'), 422,
                   "job.params.temperature")
    assert_problem(upload(client, '{"prompt": "a"}\n', '{"items": []}'), 422, "job.items", "Extra inputs")


def test_jsonl_too_many_lines_is_413(database):
    client = client_for(create_app({"max_items_per_job": 2}))
    assert_problem(upload(None, '{"prompt": "a"}\n{"prompt": "b"}\n{"prompt": "c"}\n', app_client=client), 413,
                   "items")


def test_jsonl_prompt_too_long_names_item(client):
    assert_problem(upload(client, json.dumps({"prompt": LONG_PROMPT}) + "\n"), 422, "items[0].prompt", "exceeds")


# ------------------------------------------------------------------------------------------- routing errors
@pytest.mark.parametrize("method,path,status", [
    ("get", "/nowhere", 404),
    ("get", f"/v1/jobs/{uuid.uuid4()}", 404),
    ("get", "/v1/jobs/not-a-uuid", 404),
    ("get", f"/v1/jobs/{uuid.uuid4()}/results", 404),
    ("get", f"/v1/jobs/{uuid.uuid4()}/results?format=jsonl", 404),
    ("post", f"/v1/jobs/{uuid.uuid4()}/cancel", 404),
    ("post", "/v1/jobs/123/cancel", 404),
    ("put", "/v1/jobs", 405),
    ("delete", f"/v1/jobs/{uuid.uuid4()}", 405),
    ("get", "/generate", 405),
    ("post", "/health", 405),
])
def test_routing_errors_are_problems(client, method, path, status):
    response = getattr(client, method)(path)
    assert_problem(response, status)
    if status == 405:
        assert response.headers["Allow"]


@pytest.mark.parametrize("query,field", [
    ("status=bogus", "status"), ("status=queued,nope", "status"), ("limit=0", "limit"), ("limit=101", "limit"),
    ("limit=abc", "limit"), ("after=not-a-cursor", "after"), ("page=2", "page"),
])
def test_list_query_errors(client, query, field):
    assert_problem(client.get(f"/v1/jobs?{query}"), 422, field)


@pytest.mark.parametrize("query,field", [("format=xml", "format"), ("limit=0", "limit"), ("limit=1001", "limit"),
                                         ("after=x", "after"), ("colour=red", "colour")])
def test_results_query_errors(client, query, field):
    created = client.post("/v1/jobs", json={"items": [{"prompt": "queued only"}]}).get_json()  # never decoded:
    client.post(f"/v1/jobs/{created['id']}/cancel")  # cancelled at once, so no worker ever runs it
    assert_problem(client.get(f"/v1/jobs/{created['id']}/results?{query}"), 422, field)


@pytest.mark.parametrize("body,field", [
    ({}, "prompt"), ({"prompt": ""}, "prompt"), ({"prompt": "hi", "temperature": -1}, "temperature"),
    ({"prompt": "hi", "max_new_tokens": 5000}, "max_new_tokens"), ({"prompt": LONG_PROMPT}, "prompt"),
    ({"prompt": "hi", "custom_id": "x"}, "custom_id"), ({"prompt": "hi", "measure_baseline": True}, "measure_baseline"),
])
def test_generate_validation(client, body, field):
    assert_problem(client.post("/generate", json=body), 422, field)


def test_generate_needs_json(client):
    assert_problem(client.post("/generate", data="prompt=hi", content_type="text/plain"), 415)
    assert_problem(client.post("/generate", data="{", content_type="application/json"), 400, "body")

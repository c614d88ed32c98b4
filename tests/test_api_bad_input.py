"""Hostile and broken input that tests/test_api_validation.py does not cover: characters Postgres cannot store,
nesting that would blow the parser's stack, invalid UTF-8 in uploads, numbers far out of range, prompts on the edge
of what the decoder accepts. Every answer is a 4xx problem, never a 500. No worker is needed: anything accepted is
cancelled at once."""
import io
import json

import pytest
from conftest import client_for, session_key
from test_api_validation import LONG_PROMPT, PROBLEM, assert_problem


def accepted_then_cancelled(client, response) -> dict:
    body = response.get_json()
    assert response.status_code == 202, body
    client.post(f"/v1/jobs/{body['id']}/cancel")
    return body


@pytest.mark.parametrize("body,field", [
    ({"items": [{"prompt": "a\u0000b"}]}, "items[0].prompt"),
    ({"items": [{"prompt": "ok", "custom_id": "id\u0000"}]}, "items[0].custom_id"),
    ({"items": [{"prompt": "ok"}], "metadata": {"k\u0000": "v"}}, "metadata"),
    ({"items": [{"prompt": "ok"}], "metadata": {"k": "v\u0000"}}, "metadata"),
])
def test_nul_characters_are_422(client, body, field):
    assert_problem(client.post("/v1/jobs", json=body), 422, field, "NUL")


def test_nul_in_generate_is_422(client):
    assert_problem(client.post("/generate", json={"prompt": "\u0000"}), 422, "prompt", "NUL")


def test_nul_in_a_jsonl_line_is_422_with_its_line(client):
    data = {"file": (io.BytesIO(b'{"prompt": "a"}\n{"prompt": "b\\u0000"}\n'), "items.jsonl")}
    body = assert_problem(client.post("/v1/jobs", data=data, content_type="multipart/form-data"), 422,
                          "items[1].prompt", "NUL")
    assert body["errors"][0]["line"] == 2


def test_a_lone_surrogate_is_422(client):
    response = client.post("/v1/jobs", data=b'{"items": [{"prompt": "\\ud800"}]}', content_type="application/json")
    assert_problem(response, 422, "items[0].prompt")


@pytest.mark.parametrize("path", ["/v1/jobs", "/generate"])
def test_deeply_nested_json_is_400(client, path):
    response = client.post(path, data=b"[" * 100_000 + b"]" * 100_000, content_type="application/json")
    assert_problem(response, 400, "body", "nested too deeply")


def test_deeply_nested_jsonl_line_and_job_part_are_400(client):
    deep = b"[" * 100_000 + b"]" * 100_000
    data = {"file": (io.BytesIO(b'{"prompt": "a"}\n' + deep + b"\n"), "items.jsonl")}
    body = assert_problem(client.post("/v1/jobs", data=data, content_type="multipart/form-data"), 400, "file")
    assert body["errors"][0]["line"] == 2
    data = {"file": (io.BytesIO(b'{"prompt": "a"}\n'), "items.jsonl"), "job": deep.decode()}
    assert_problem(client.post("/v1/jobs", data=data, content_type="multipart/form-data"), 400, "job")


def test_invalid_utf8_in_jsonl_is_400_with_its_line(client):
    data = {"file": (io.BytesIO(b'{"prompt": "a"}\n{"prompt": "\xc3\x28"}\n'), "items.jsonl")}
    body = assert_problem(client.post("/v1/jobs", data=data, content_type="multipart/form-data"), 400, "file",
                          "not valid JSON")
    assert body["errors"][0]["line"] == 2


def test_invalid_utf8_in_the_job_part_is_4xx(client):
    body = (b'--b\r\nContent-Disposition: form-data; name="file"; filename="items.jsonl"\r\n\r\n{"prompt": "a"}\n'
            b'\r\n--b\r\nContent-Disposition: form-data; name="job"\r\n\r\n{"type": "\xff"}\r\n--b--\r\n')
    response = client.post("/v1/jobs", data=body, content_type="multipart/form-data; boundary=b")
    assert_problem(response, 422, "job.type")


def test_a_binary_file_is_400(client):
    data = {"file": (io.BytesIO(bytes(range(256)) * 4), "items.jsonl")}
    assert_problem(client.post("/v1/jobs", data=data, content_type="multipart/form-data"), 400, "file")


def test_json_that_is_not_an_object(client):
    for raw in (b"null", b"42", b'"text"', b"true"):
        assert_problem(client.post("/v1/jobs", data=raw, content_type="application/json"), 422, "body")
        assert_problem(client.post("/generate", data=raw, content_type="application/json"), 422, "body")


def test_empty_body_is_400(client):
    assert_problem(client.post("/v1/jobs", data=b"", content_type="application/json"), 400, "body")


def test_json_with_charset_parameter_is_accepted(client):
    response = client.post("/v1/jobs", data=json.dumps({"items": [{"prompt": "hi"}]}),
                           content_type="application/json; charset=utf-8")
    accepted_then_cancelled(client, response)


@pytest.mark.parametrize("content_type", ["application/xml", "multipart/mixed; boundary=x", "application/jsonl"])
def test_more_wrong_content_types_are_415(client, content_type):
    assert_problem(client.post("/v1/jobs", data=b"{}", content_type=content_type), 415)


@pytest.mark.parametrize("params,field", [
    ({"max_new_tokens": 10**30}, "params.max_new_tokens"),
    ({"max_new_tokens": -(10**30)}, "params.max_new_tokens"),
    ({"max_new_tokens": 1e400}, "params.max_new_tokens"),  # JSON's 1e400 parses as infinity
    ({"temperature": 1e400}, "params.temperature"),
    ({"temperature": float("nan")}, "params.temperature"),
    ({"top_k": 2**63}, "params.top_k"),
    ({"seed": 2**31}, "params.seed"),
    ({"seed": 10**100}, "params.seed"),
    ({"parallel_degree": -(2**63)}, "params.parallel_degree"),
    ({"validation_threshold": -1e-300}, "params.validation_threshold"),
])
def test_numbers_out_of_range_are_422(client, params, field):
    body = json.dumps({"items": [{"prompt": "hi"}], "params": params})  # allow_nan: NaN and Infinity literals
    assert_problem(client.post("/v1/jobs", data=body, content_type="application/json"), 422, field)


@pytest.mark.parametrize("priority", [10**30, -(10**30), 1e308, 5.5])
def test_priority_out_of_range_is_422(client, priority):
    assert_problem(client.post("/v1/jobs", json={"items": [{"prompt": "hi"}], "priority": priority}), 422,
                   "priority")


def test_huge_query_numbers_are_422_or_empty(client):
    assert_problem(client.get("/v1/jobs?limit=99999999999999999999999"), 422, "limit")
    assert_problem(client.get("/v1/jobs?limit=-1"), 422, "limit")
    created = accepted_then_cancelled(client, client.post("/v1/jobs", json={"items": [{"prompt": "hi"}]}))
    for after in ("99999999999999999999999", str(2**63), str(2**31)):
        response = client.get(f"/v1/jobs/{created['id']}/results?after={after}")
        assert response.status_code in (200, 422), response.get_json()
        if response.status_code == 200:
            assert response.get_json()["data"] == []
    assert_problem(client.get(f"/v1/jobs/{created['id']}/results?after=-2"), 422, "after")


def test_unknown_fields_everywhere_are_422(client):
    assert_problem(client.post("/v1/jobs", json={"items": [{"prompt": "hi"}], "params": {"Temperature": 0}}), 422,
                   "params.Temperature")
    assert_problem(client.post("/generate", json={"prompt": "hi", "stream": True}), 422, "stream")
    data = {"file": (io.BytesIO(b'{"prompt": "a", "extra": 1}\n'), "items.jsonl")}
    assert_problem(client.post("/v1/jobs", data=data, content_type="multipart/form-data"), 422, "items[0].extra")


def test_the_context_bound_is_the_decoders(client):
    """The decoder keeps room for one draft tree past the prompt (prompt < context - depth - 2): the API applies
    the same bound, so a prompt it accepts is never refused by the worker for its length (tiny: 1024 - 7)."""
    from jobs import tokenizer

    # the chat template's tokens; one per character after that
    template = len(tokenizer.load("tiny").encode_messages(tokenizer.turns("", None)))
    longest = 1024 - 7 - 1 - template
    ok = {"items": [{"prompt": "x" * longest}], "params": {"max_new_tokens": 1}}
    accepted_then_cancelled(client, client.post("/v1/jobs", json=ok))
    too_long = {"items": [{"prompt": "x" * (longest + 1)}], "params": {"max_new_tokens": 1}}
    assert_problem(client.post("/v1/jobs", json=too_long), 422, "items[0].prompt", "draft tree")

    from eagle3 import SpeculativeDecoder, load_target

    decoder = SpeculativeDecoder(load_target("tiny"))
    assert decoder.generate(["x" * longest], max_new_tokens=1)[0].token_ids
    with pytest.raises(ValueError, match="context"):
        decoder.generate(["x" * (longest + 1)], max_new_tokens=1)


def test_long_prompt_still_names_the_context(client):
    assert_problem(client.post("/v1/jobs", json={"items": [{"prompt": LONG_PROMPT}]}), 422, "items[0].prompt",
                   "exceeds the model's context")


def test_the_database_down_is_503_not_500(database):
    from api import create_app

    # a well-formed key: checking it needs the database, which is down
    down = client_for(create_app({"database_url": "postgresql+psycopg://root@127.0.0.1:1/nothing"}),
                      key=session_key())
    for response in (down.get("/v1/jobs"), down.get("/v1/jobs/00000000-0000-0000-0000-000000000000"),
                     down.post("/v1/jobs", json={"items": [{"prompt": "hi"}]})):
        assert_problem(response, 503)
        assert response.headers["Retry-After"] == "5"


def cursor_of(raw: bytes) -> str:
    import base64

    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


@pytest.mark.parametrize("raw", [
    b"[" * 1200 + b"]" * 1200,  # nested past the parser's recursion limit
    b'["2026-01-01T00:00:00+00:00", 123]',  # a job id that is not a string
    b'[["2026-01-01T00:00:00+00:00"], "00000000-0000-0000-0000-000000000000"]',
    b'{"a": 1, "b": 2}', b"[]", b"null", b"\xff\xfe",
])
def test_a_cursor_that_is_not_ours_is_422(client, raw):
    assert_problem(client.get(f"/v1/jobs?after={cursor_of(raw)}"), 422, "after")


@pytest.mark.parametrize("raw,field", [
    ('{"items": [{"custom_id": "\\udfff", "prompt": "x"}]}', "items[0].custom_id"),
    ('{"items": [{"prompt": "x"}], "metadata": {"k": "\\udfff"}}', "metadata"),
    ('{"items": [{"prompt": "x"}], "metadata": {"\\ud800": "v"}}', "metadata"),
    ('{"items": [{"prompt": "\\ud800\\udc00 is a pair, this one is not: \\udc00"}]}', "items[0].prompt"),
])
def test_lone_surrogates_anywhere_are_422(client, raw, field):
    assert_problem(client.post("/v1/jobs", data=raw, content_type="application/json"), 422, field)


def test_a_surrogate_pair_is_a_character_and_accepted(client):
    raw = '{"items": [{"custom_id": "\\ud83d\\ude00", "prompt": "smile \\ud83d\\ude00"}]}'
    body = accepted_then_cancelled(client, client.post("/v1/jobs", data=raw, content_type="application/json"))
    assert body["item_counts"]["total"] == 1


def test_lone_surrogates_in_a_jsonl_upload_are_422_with_the_line(client):
    lines = b'{"prompt": "a"}\n{"custom_id": "\\udfff", "prompt": "b"}\n'
    data = {"file": (io.BytesIO(lines), "items.jsonl"), "job": '{"metadata": {"k": "\\ud800"}}'}
    assert_problem(client.post("/v1/jobs", data=data, content_type="multipart/form-data"), 422, "job.metadata")
    data = {"file": (io.BytesIO(lines), "items.jsonl")}
    body = assert_problem(client.post("/v1/jobs", data=data, content_type="multipart/form-data"), 422,
                          "items[1].custom_id")
    assert body["errors"][0]["line"] == 2


@pytest.mark.parametrize("where,value,field", [
    ("params", {"temperature": "0.5"}, "params.temperature"),
    ("params", {"max_new_tokens": True}, "params.max_new_tokens"),
    ("params", {"max_new_tokens": "4"}, "params.max_new_tokens"),
    ("params", {"max_new_tokens": 4.0}, "params.max_new_tokens"),
    ("params", {"measure_baseline": "yes"}, "params.measure_baseline"),
    ("params", {"measure_baseline": 1}, "params.measure_baseline"),
    ("params", {"seed": "5"}, "params.seed"),
    ("item", {"top_k": "3"}, "items[0].top_k"),
    ("item", {"prompt": 5}, "items[0].prompt"),
    ("job", {"priority": "7"}, "priority"),
    ("job", {"priority": True}, "priority"),
    ("job", {"metadata": {"k": 1}}, "metadata.k"),
])
def test_types_are_strict(client, where, value, field):
    body = {"items": [{"prompt": "hi"}]}
    if where == "params":
        body["params"] = value
    elif where == "item":
        body["items"][0].update(value)
    else:
        body.update(value)
    assert_problem(client.post("/v1/jobs", json=body), 422, field)


@pytest.mark.parametrize("body,field", [
    ({"prompt": "hi", "seed": "5"}, "seed"),
    ({"prompt": "hi", "temperature": "0.5"}, "temperature"),
    ({"prompt": "hi", "max_new_tokens": True}, "max_new_tokens"),
])
def test_generate_types_are_strict(client, body, field):
    assert_problem(client.post("/generate", json=body), 422, field)


def test_an_integer_is_a_number(client):
    """Strict, not pedantic: JSON has one number type, so 1 is a valid temperature."""
    body = {"items": [{"prompt": "hi", "temperature": 1, "top_p": 1}], "params": {"validation_threshold": 1}}
    accepted_then_cancelled(client, client.post("/v1/jobs", json=body))

"""/v1/files and /v1/batches with hostile input, in-process: never a 5xx, every line accounted for."""
import io
import json

from conftest import RUN_ID, client_for, make_key

from api import create_app

CHAT = "/v1/chat/completions"


def upload(client, raw: bytes, name="in.jsonl"):
    response = client.post("/v1/files", data={"file": (io.BytesIO(raw), name), "purpose": "batch"},
                           content_type="multipart/form-data")
    assert response.status_code == 200, response.get_json()
    return response.get_json()


def create(client, file_id, endpoint=CHAT):
    return client.post("/v1/batches", json={"input_file_id": file_id, "endpoint": endpoint,
                                            "completion_window": "24h"})


def test_hostile_lines_are_line_errors_not_5xx(database):
    idle = client_for(create_app({"queue": f"idle-batches-{RUN_ID}"}))  # nobody decodes: only validation is exercised
    good = {"custom_id": "ok", "method": "POST", "url": CHAT,
            "body": {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}}
    lines = [json.dumps(good).encode(),
             json.dumps({**good, "custom_id": "nul\u0000id"}).encode(),
             b'{"custom_id": "\\ud800", "url": "/v1/chat/completions", "body": {}}',
             b'{"custom_id": "bad-utf8", "body": "\xff\xfe"}',
             b"[1, 2, 3]", b'"just a string"', b"[" * 5000 + b"]" * 5000,
             json.dumps({**good, "custom_id": "body-list", "body": [1]}).encode(),
             json.dumps({**good, "custom_id": "x" * 300}).encode(),
             json.dumps({**good, "custom_id": "big", "body": {**good["body"], "max_tokens": 10**30}}).encode()]
    file = upload(idle, b"\n".join(lines) + b"\n", name="we\u0000ird\u00e9.jsonl")
    assert "\x00" not in file["filename"] and file["filename"] == "weird\u00e9.jsonl"
    response = create(idle, file["id"])
    assert response.status_code == 200, response.get_json()
    batch = response.get_json()
    assert batch["status"] == "in_progress" and batch["request_counts"]["total"] == len(lines)
    assert [e["line"] for e in batch["errors"]["data"]] == list(range(2, len(lines) + 1))
    cancelled = idle.post(f"/v1/batches/{batch['id']}/cancel").get_json()
    assert cancelled["status"] == "cancelled"
    errors = idle.get(f"/v1/files/{cancelled['error_file_id']}/content").get_data(as_text=True)
    named = [json.loads(line)["custom_id"] for line in errors.splitlines()]
    assert named.count(None) == 7 and {"ok", "body-list", "big"} <= set(named)


def test_files_and_batches_validation_is_400(client):
    assert client.post("/v1/files", data={"purpose": "batch"}, content_type="multipart/form-data").status_code == 400
    assert client.post("/v1/files", json={"purpose": "batch"}).status_code == 400
    file = upload(client, b"{}\n")
    for body in ({"input_file_id": file["id"], "endpoint": CHAT, "completion_window": "1h"},
                 {"input_file_id": file["id"], "endpoint": CHAT, "completion_window": "24h", "metadata": {"k": 1}},
                 {"input_file_id": file["id"], "endpoint": CHAT, "completion_window": "24h", "extra": 1},
                 {"endpoint": CHAT, "completion_window": "24h"}):
        response = client.post("/v1/batches", json=body)
        assert response.status_code == 400 and response.get_json()["error"]["param"], response.get_json()
    for query in ("limit=0", "limit=x", "after=batch_nope", "bogus=1"):
        assert client.get(f"/v1/batches?{query}").status_code == 400
    for query in ("limit=0", "order=up", "after=file-nope"):
        assert client.get(f"/v1/files?{query}").status_code == 400
    assert client.post("/v1/batches/batch_nope/cancel").status_code == 404
    assert client.delete(f"/v1/files/{file['id']}").get_json() == {"id": file["id"], "object": "file",
                                                                     "deleted": True}
    assert client.get(f"/v1/files/{file['id']}/content").status_code == 404
    other = make_key("files-other")
    assert client.get("/v1/files", headers={"Authorization": f"Bearer {other}"}).get_json()["data"] == []

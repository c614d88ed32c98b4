"""/v1/files storage and retention (jobs/files.py), each test in both storages: bytes in Postgres, or in FILES_DIR.
Upload, read, delete; expires_at; an expired file gone for its owner and deleted by the sweep, unless a running
batch reads it; a batch whose input and output files live in the directory; FILES_DIR's orphans."""
import io
import json
import os
import time
import uuid
from types import SimpleNamespace

import pytest
from conftest import client_for
from sqlalchemy import func, select, update

from api import create_app
from jobs import files
from jobs.models import Batch, File, Job

RETENTION_S = 3600


@pytest.fixture(params=["postgres", "directory"])
def storage(request, tmp_path, database):
    directory = tmp_path / "files" if request.param == "directory" else None
    if directory is not None:
        directory.mkdir()
    app = create_app({"files_dir": str(directory or ""), "input_file_retention_s": RETENTION_S})
    state = app.extensions["jobs"]
    return SimpleNamespace(client=client_for(app), settings=state.settings, Session=state.Session, dir=directory)


def upload(client, content: bytes, name: str = "input.jsonl") -> dict:
    response = client.post("/v1/files", data={"purpose": "batch", "file": (io.BytesIO(content), name)},
                           content_type="multipart/form-data")
    assert response.status_code == 200, response.get_json()
    return response.get_json()


def row(storage, file_id) -> File | None:
    with storage.Session() as session:
        return session.get(File, file_id)


def expire(storage, file_id) -> None:
    with storage.Session.begin() as session:
        session.execute(update(File).where(File.id == file_id).values(expires_at=func.now() - func.make_interval(
            0, 0, 0, 0, 0, 0, 1)))


def assert_gone(client, file_id) -> None:
    for path in (f"/v1/files/{file_id}", f"/v1/files/{file_id}/content"):
        response = client.get(path)
        assert response.status_code == 404 and response.get_json()["error"]["type"] == "not_found_error"


def test_upload_read_delete(storage):
    content = b'{"custom_id": "a"}\n' * 3
    made = upload(storage.client, content)
    assert made["bytes"] == len(content) and made["expires_at"] - made["created_at"] == RETENTION_S
    assert storage.client.get(f"/v1/files/{made['id']}/content").data == content
    stored = row(storage, made["id"])
    if storage.dir is None:
        assert stored.content == content
    else:  # the row keeps no bytes; the directory has them under the file's id
        assert stored.content is None and (storage.dir / made["id"]).read_bytes() == content
        assert os.listdir(storage.dir) == [made["id"]]  # no partial file left behind
    assert storage.client.delete(f"/v1/files/{made['id']}").get_json()["deleted"] is True
    assert_gone(storage.client, made["id"])
    assert row(storage, made["id"]) is None
    if storage.dir is not None:
        assert os.listdir(storage.dir) == []


def test_expired_file_is_gone_and_swept(storage):
    kept, old = upload(storage.client, b"{}\n"), upload(storage.client, b"{}\n")
    expire(storage, old["id"])
    assert_gone(storage.client, old["id"])
    listed = [f["id"] for f in storage.client.get("/v1/files?limit=10000").get_json()["data"]]
    assert kept["id"] in listed and old["id"] not in listed
    with storage.Session() as session:
        files.sweep(session, storage.settings)
    assert row(storage, old["id"]) is None and row(storage, kept["id"]) is not None
    if storage.dir is not None:
        assert sorted(os.listdir(storage.dir)) == [kept["id"]]


def test_expired_input_of_a_running_batch_is_kept_until_it_ends(storage):
    made = upload(storage.client, b"{}\n")
    with storage.Session.begin() as session:
        key_id = session.get(File, made["id"]).api_key_id
        job = Job(type="generation", status="running", total_items=1, api_key_id=key_id)
        session.add(job)
        session.flush()
        session.add(Batch(id=f"batch_{uuid.uuid4().hex}", api_key_id=key_id, job_id=job.id, input_file_id=made["id"],
                          endpoint="/v1/chat/completions", completion_window="24h", total_requests=1,
                          expires_at=func.now()))
        job_id = job.id
    expire(storage, made["id"])
    with storage.Session() as session:
        files.sweep(session, storage.settings)
    assert storage.client.get(f"/v1/files/{made['id']}/content").data == b"{}\n"  # still read by its batch
    with storage.Session.begin() as session:
        session.execute(update(Job).where(Job.id == job_id).values(status="completed"))
    with storage.Session() as session:
        assert files.sweep(session, storage.settings) >= 1
    assert row(storage, made["id"]) is None
    assert_gone(storage.client, made["id"])


def test_batch_input_and_output_in_the_storage(storage, worker):
    lines = [{"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions",
              "body": {"model": "tiny", "prompt": f"Count to {i}.", "max_tokens": 4, "temperature": 0}}
             for i in range(3)]
    made = upload(storage.client, "".join(json.dumps(line) + "\n" for line in lines).encode())
    response = storage.client.post("/v1/batches", json={"input_file_id": made["id"], "endpoint": "/v1/completions",
                                                        "completion_window": "24h"})
    assert response.status_code == 200, response.get_json()
    deadline = time.monotonic() + 90
    while (batch := storage.client.get(f"/v1/batches/{response.get_json()['id']}").get_json())["status"] not in (
            "completed", "failed"):
        assert time.monotonic() < deadline, batch
        time.sleep(0.2)
    assert batch["status"] == "completed" and batch["request_counts"]["completed"] == 3
    output = storage.client.get(f"/v1/files/{batch['output_file_id']}/content").data
    assert sorted(json.loads(line)["custom_id"] for line in output.splitlines()) == ["r0", "r1", "r2"]
    out = storage.client.get(f"/v1/files/{batch['output_file_id']}").get_json()
    assert out["purpose"] == "batch_output"
    assert out["expires_at"] - out["created_at"] == pytest.approx(30 * 86400, abs=2)
    if storage.dir is not None:
        assert row(storage, batch["output_file_id"]).content is None
        assert (storage.dir / batch["output_file_id"]).read_bytes() == output


def test_a_missing_input_file_is_400_not_500(storage):
    """Bytes deleted behind the row's back (FILES_DIR lost them) make the file unusable, never a 500."""
    made = upload(storage.client, b"{}\n")
    if storage.dir is None:
        with storage.Session.begin() as session:
            session.execute(update(File).where(File.id == made["id"]).values(content=None))
    else:
        (storage.dir / made["id"]).unlink()
    response = storage.client.post("/v1/batches", json={"input_file_id": made["id"], "endpoint": "/v1/completions",
                                                        "completion_window": "24h"})
    assert response.status_code == 400 and response.get_json()["error"]["param"] == "input_file_id"
    assert storage.client.get(f"/v1/files/{made['id']}/content").status_code == 404


def test_orphans_in_the_directory_are_removed_once_old(tmp_path, database):
    """Directory storage only: files without a row (an upload whose commit failed) go once older than an hour."""
    app = create_app({"files_dir": str(tmp_path)})
    state = app.extensions["jobs"]
    storage = SimpleNamespace(client=client_for(app), settings=state.settings, Session=state.Session, dir=tmp_path)
    made = upload(storage.client, b"{}\n")
    old, young = storage.dir / "file-orphan", storage.dir / "file-young"
    for path in (old, young):
        path.write_bytes(b"x")
    stale = time.time() - files.ORPHAN_AGE_S - 60
    for path in (old, storage.dir / made["id"]):
        os.utime(path, (stale, stale))
    with storage.Session() as session:
        files.sweep(session, storage.settings)
        assert session.scalar(select(File.id).where(File.id == made["id"])) == made["id"]
    assert sorted(os.listdir(storage.dir)) == sorted([made["id"], "file-young"])


def test_no_retention_means_no_expiry(database):
    client = client_for(create_app({"input_file_retention_s": 0}))
    assert upload(client, b"{}\n")["expires_at"] is None

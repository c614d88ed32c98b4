"""The official `openai` Python package (pinned in requirements.txt) against the API served over HTTP by a live
server, with the real worker decoding: models, chat (plain and streamed), completions, the client's exception
classes, and (below) files and batches."""
import json
import time
from datetime import timedelta

import openai
import pytest
from conftest import RUN_ID, make_key, serving
from sqlalchemy import func, update

from jobs.models import Batch, File

MODEL = "tiny"  # EAGLE3_TARGET of the test session
SYSTEM = {"role": "system", "content": "You are terse."}
FINAL = ("completed", "failed", "expired", "cancelled")


@pytest.fixture(scope="module")
def base_url(app):
    with serving(app) as url:
        yield url + "/v1"


@pytest.fixture(scope="module")
def oai(base_url, api_key):
    return openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=60)


def chat(oai, messages, **kw):
    return oai.chat.completions.create(model=MODEL, messages=messages, temperature=0, **kw)


def test_models(oai):
    models = oai.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert oai.models.retrieve(MODEL).id == MODEL


def test_chat_plain_and_streamed_give_the_same_text(oai, worker):
    messages = [SYSTEM, {"role": "user", "content": "Say hello."}]
    plain = chat(oai, messages, max_tokens=10)
    assert plain.object == "chat.completion" and plain.model == MODEL
    text = plain.choices[0].message.content
    assert plain.choices[0].message.role == "assistant" and text
    assert plain.choices[0].finish_reason in ("stop", "length")
    assert plain.usage.completion_tokens == plain.model_extra["eagle3"]["new_tokens"] <= 10
    assert plain.usage.prompt_tokens > len("Say hello.") and plain.usage.total_tokens == \
        plain.usage.prompt_tokens + plain.usage.completion_tokens
    assert plain.model_extra["eagle3"]["accept_length"] >= 1.0

    stream = chat(oai, messages, max_tokens=10, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    contents = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(contents) > 1, chunks  # the text arrives as it is decoded, not in one piece at the end
    assert "".join(contents) == text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == plain.choices[0].finish_reason
    assert chunks[-1].usage.total_tokens == plain.usage.total_tokens


def test_completions_and_stop(oai, worker):
    full = oai.completions.create(model=MODEL, prompt="Count to five.", max_tokens=12, temperature=0)
    text = full.choices[0].text
    assert full.object == "text_completion" and len(text) >= 4
    cut = oai.completions.create(model=MODEL, prompt="Count to five.", max_tokens=12, temperature=0, stop=[text[2:4]])
    assert cut.choices[0].text == text[:text.index(text[2:4])] and cut.choices[0].finish_reason == "stop"
    assert cut.usage.completion_tokens < full.usage.completion_tokens


def test_streamed_completion_equals_the_plain_one_with_and_without_stop(oai, worker):
    """Token by token: several text chunks whose concatenation is the non-streamed answer at temperature 0, also
    when a stop string cuts it (the stream never sends text past the stop)."""
    prompt = "Count to five."
    full = oai.completions.create(model=MODEL, prompt=prompt, max_tokens=16, temperature=0).choices[0].text
    stop = full[6:8]
    for kwargs in ({}, {"stop": [stop]}):
        plain = oai.completions.create(model=MODEL, prompt=prompt, max_tokens=16, temperature=0, **kwargs)
        chunks = list(oai.completions.create(model=MODEL, prompt=prompt, max_tokens=16, temperature=0, stream=True,
                                             **kwargs))
        texts = [c.choices[0].text for c in chunks if c.choices and c.choices[0].text]
        assert len(texts) > 1, chunks
        assert "".join(texts) == plain.choices[0].text
        assert chunks[-1].choices[0].finish_reason == plain.choices[0].finish_reason
    assert plain.choices[0].text == full[:full.index(stop)] and plain.choices[0].finish_reason == "stop"


def test_a_stream_without_a_result_in_time_ends_with_an_error_the_client_raises(api_key):
    """After the 200 is sent, a timeout can only be an `error` event: the client raises it, no [DONE] is faked."""
    from api import create_app

    app = create_app({"queue": f"nobody-{RUN_ID}", "generate_timeout_s": 1.0})  # no worker consumes this queue
    with serving(app) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key=api_key, max_retries=0, timeout=30)
        stream = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                                stream=True)
        with pytest.raises(openai.APIError, match="no result within 1 s"):
            list(stream)


def test_client_exception_classes(oai, base_url):
    with pytest.raises(openai.AuthenticationError) as caught:
        openai.OpenAI(base_url=base_url, api_key="e3k_wrong", max_retries=0).models.list()
    assert caught.value.status_code == 401 and caught.value.body["type"] == "authentication_error"
    with pytest.raises(openai.NotFoundError):
        oai.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.NotFoundError):
        oai.batches.retrieve("batch_doesnotexist")
    with pytest.raises(openai.BadRequestError) as caught:
        oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], temperature=5)
    assert caught.value.body["param"] == "temperature" and "less than or equal" in caught.value.body["message"]
    with pytest.raises(openai.BadRequestError):
        oai.chat.completions.create(model=MODEL, messages=[], n=1)
    with pytest.raises(openai.BadRequestError) as caught:
        oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], n=2)
    assert caught.value.body["param"] == "n"


def test_errors_on_openai_routes_have_openai_shape(client, anon_client):
    for response, status in ((anon_client.get("/v1/models"), 401), (client.get("/v1/models/nope"), 404),
                             (client.post("/v1/chat/completions", json={"model": MODEL}), 400),
                             (client.post("/v1/chat/completions", data="{", content_type="application/json"), 400),
                             (client.get("/v1/chat/completions"), 405)):
        assert response.status_code == status
        error = response.get_json()["error"]
        assert set(error) >= {"message", "type", "param", "code"} and error["message"]
    assert client.get("/v1/jobs/nope").mimetype == "application/problem+json"  # native routes keep problem+json
    other = make_key("other")
    assert client.get("/v1/models", headers={"Authorization": f"Bearer {other}"}).status_code == 200


# ------------------------------------------------------------------------------------------------ batches
def jsonl(lines) -> bytes:
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


def chat_line(custom_id, messages, **body):
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": MODEL, "messages": messages, "temperature": 0, "max_tokens": 8, **body}}


def run_batch(oai, lines, timeout=90, **kw):
    file = oai.files.create(file=("input.jsonl", jsonl(lines)), purpose="batch")
    assert file.purpose == "batch" and file.bytes == len(jsonl(lines))
    batch = oai.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h",
                               **kw)
    return wait_batch(oai, batch.id, timeout)


def wait_batch(oai, batch_id, timeout=90, until=FINAL):
    deadline = time.monotonic() + timeout
    while True:
        batch = oai.batches.retrieve(batch_id)
        if batch.status in until:
            return batch
        assert time.monotonic() < deadline, batch
        time.sleep(0.2)


def read_lines(oai, file_id) -> dict:
    if file_id is None:
        return {}
    lines = [json.loads(line) for line in oai.files.content(file_id).text.splitlines()]
    by_id = {line["custom_id"] or line["id"]: line for line in lines}  # a line without a custom_id: by its id
    assert len(by_id) == len(lines)  # one line per custom_id
    return by_id


def test_batch_equals_the_sync_answers(oai, worker):
    """25 requests with system prompts, multi-turn messages and stop strings: completed, one output line per
    custom_id, each equal to the synchronous answer at temperature 0."""
    requests = []
    for i in range(25):
        user = {"role": "user", "content": f"Question {i}: name a number."}
        if i % 3 == 0:
            messages = [SYSTEM, user]
        elif i % 3 == 1:
            messages = [user, {"role": "assistant", "content": f"{i}."}, {"role": "user", "content": "Another?"}]
        else:
            messages = [{"role": "system", "content": f"Persona {i}."}, user]
        requests.append((f"req-{i}", messages, {}))
    for k in range(0, 25, 5):  # stop strings that occur in the answer, so the cut is exercised
        custom_id, messages, _ = requests[k]
        text = chat(oai, messages, max_tokens=8).choices[0].message.content
        requests[k] = (custom_id, messages, {"stop": [text[2:4], "zzzz"]})

    batch = run_batch(oai, [chat_line(c, m, **b) for c, m, b in requests], metadata={"suite": "openai"})
    assert batch.status == "completed" and batch.error_file_id is None and batch.errors is None
    assert batch.request_counts.total == batch.request_counts.completed == 25 and batch.request_counts.failed == 0
    assert batch.metadata == {"suite": "openai"} and batch.model == MODEL
    assert batch.created_at <= batch.in_progress_at <= batch.finalizing_at <= batch.completed_at
    assert batch.expires_at == batch.created_at + 24 * 3600
    out = read_lines(oai, batch.output_file_id)
    assert set(out) == {c for c, _, _ in requests}
    for custom_id, messages, body in requests:
        line = out[custom_id]
        assert line["error"] is None and line["response"]["status_code"] == 200
        got = line["response"]["body"]
        want = chat(oai, messages, max_tokens=8, **body)
        assert got["choices"][0]["message"]["content"] == want.choices[0].message.content
        assert got["choices"][0]["finish_reason"] == want.choices[0].finish_reason
        assert got["usage"] == want.usage.model_dump(exclude_none=True)
        assert got["eagle3"]["accept_length"] >= 1.0 and got["eagle3"]["speedup_kind"] == "estimated"
        if body:
            assert got["choices"][0]["finish_reason"] == "stop"
    usage = batch.usage
    assert usage.output_tokens == sum(line["response"]["body"]["usage"]["completion_tokens"] for line in out.values())
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens and usage.input_tokens > 25 * 10


def test_bad_lines_are_accounted_for(oai, worker):
    user = [{"role": "user", "content": "Hi"}]
    lines = [chat_line("ok-1", user), chat_line("ok-2", user, max_tokens=None, max_completion_tokens=3)]
    bad = [chat_line("bad-temperature", user, temperature=5), chat_line("bad-model", user, model="gpt-4o"),
           {**chat_line("bad-url", user), "url": "/v1/embeddings"}, chat_line("bad-messages", []),
           chat_line("bad-role", [{"role": "tool", "content": "x"}]), chat_line("bad-n", user, n=3),
           chat_line("too-long", [{"role": "user", "content": "x" * 2000}]),
           chat_line("too-many-tokens", user, max_tokens=5000), {"custom_id": "no-body", "url": "/v1/chat/completions"}]
    raw = jsonl(lines + bad) + b"{not json\n\n" + jsonl([{"method": "POST"}])
    file = oai.files.create(file=("bad.jsonl", raw), purpose="batch")
    batch = wait_batch(oai, oai.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions",
                                               completion_window="24h").id)
    assert batch.status == "completed"
    assert batch.request_counts.model_dump() == {"total": 13, "completed": 2, "failed": 11}
    assert {e.line for e in batch.errors.data} == set(range(3, 12)) | {12, 14}  # blank line 13 is not a request
    out, errors = read_lines(oai, batch.output_file_id), read_lines(oai, batch.error_file_id)
    assert set(out) == {"ok-1", "ok-2"}
    named = {custom_id for custom_id in errors if not custom_id.startswith("batch_req_")}
    assert named == {line["custom_id"] for line in bad}
    assert sorted(k.rsplit("_", 1)[1] for k in set(errors) - named) == ["line12", "line14"]
    assert out["ok-2"]["response"]["body"]["usage"]["completion_tokens"] <= 3
    for custom_id, line in errors.items():
        assert line["response"]["status_code"] == 400 and line["response"]["body"]["error"]["message"]
    assert errors["bad-model"]["response"]["body"]["error"]["code"] == "model_not_found"
    assert errors["bad-temperature"]["response"]["body"]["error"]["param"] == "body.temperature"
    assert "context" in errors["too-long"]["response"]["body"]["error"]["message"]


def test_batch_that_cannot_run_fails_with_line_numbers(oai):
    user = [{"role": "user", "content": "Hi"}]
    batch = oai.batches.create(input_file_id=oai.files.create(
        file=("dup.jsonl", jsonl([chat_line("a", user), chat_line("b", user), chat_line("a", user)])),
        purpose="batch").id, endpoint="/v1/chat/completions", completion_window="24h")
    assert batch.status == "failed" and batch.failed_at and batch.output_file_id is None
    assert [(e.code, e.line) for e in batch.errors.data] == [("duplicate_custom_id", 3)]
    empty = oai.files.create(file=("empty.jsonl", b"\n"), purpose="batch")
    batch = oai.batches.create(input_file_id=empty.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert batch.status == "failed" and batch.errors.data[0].code == "empty_file"
    with pytest.raises(openai.BadRequestError):
        oai.batches.create(input_file_id="file-nope", endpoint="/v1/chat/completions", completion_window="24h")
    with pytest.raises(openai.BadRequestError):
        oai.batches.create(input_file_id=empty.id, endpoint="/v1/embeddings", completion_window="24h")
    with pytest.raises(openai.BadRequestError):
        oai.files.create(file=("x.jsonl", b"{}"), purpose="fine-tune")


def running_batch(oai, prefix: str):
    """A 48-request batch (48 tokens each: several worker batches), once its first requests have finished."""
    lines = [chat_line(f"{prefix}-{i}", [{"role": "user", "content": f"{prefix}: a long story {i}."}], max_tokens=48)
             for i in range(48)]
    file = oai.files.create(file=(f"{prefix}.jsonl", jsonl(lines)), purpose="batch")
    batch = oai.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h")
    deadline = time.monotonic() + 60
    while oai.batches.retrieve(batch.id).request_counts.completed == 0:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return batch, lines


def test_cancel_keeps_partial_results(oai, worker):
    batch, lines = running_batch(oai, "cancel")
    cancelling = oai.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled") and cancelling.cancelling_at
    batch = wait_batch(oai, batch.id, until=("cancelled",))
    counts = batch.request_counts
    assert 0 < counts.completed < 48 and counts.completed + counts.failed == 48 and batch.cancelled_at
    out, errors = read_lines(oai, batch.output_file_id), read_lines(oai, batch.error_file_id)
    assert len(out) == counts.completed and set(out) | set(errors) == {line["custom_id"] for line in lines}
    assert all(line["error"]["code"] == "batch_cancelled" for line in errors.values())
    with pytest.raises(openai.ConflictError):
        oai.batches.cancel(run_batch(oai, lines[:1]).id)  # a completed batch cannot be cancelled


def test_listing_and_another_keys_404(oai, base_url, worker):
    made = [oai.batches.create(input_file_id=oai.files.create(
        file=(f"l{i}.jsonl", jsonl([chat_line("x", [{"role": "user", "content": "Hi"}])])), purpose="batch").id,
        endpoint="/v1/chat/completions", completion_window="24h") for i in range(3)]
    first = oai.batches.list(limit=2)
    assert [b.id for b in first.data] == [made[2].id, made[1].id] and first.has_more
    second = oai.batches.list(limit=2, after=first.data[-1].id)
    assert second.data[0].id == made[0].id
    listed = [b.id for b in oai.batches.list(limit=100).data]
    assert listed.index(made[2].id) < listed.index(made[0].id)
    files = [f.id for f in oai.files.list(purpose="batch")]
    assert made[0].input_file_id in files

    other = openai.OpenAI(base_url=base_url, api_key=make_key("other-oai"), max_retries=0)
    for call in (lambda: other.batches.retrieve(made[0].id), lambda: other.batches.cancel(made[0].id),
                 lambda: other.files.retrieve(made[0].input_file_id),
                 lambda: other.files.content(made[0].input_file_id),
                 lambda: other.files.delete(made[0].input_file_id)):
        with pytest.raises(openai.NotFoundError):
            call()
    with pytest.raises(openai.BadRequestError):  # another key's file cannot feed a batch either
        other.batches.create(input_file_id=made[0].input_file_id, endpoint="/v1/chat/completions",
                             completion_window="24h")
    assert other.batches.list().data == [] and other.files.list().data == []

    finished = wait_batch(oai, made[0].id)
    assert oai.files.retrieve(finished.output_file_id).purpose == "batch_output"
    assert oai.files.delete(made[0].input_file_id).deleted
    with pytest.raises(openai.NotFoundError):
        oai.files.retrieve(made[0].input_file_id)
    assert oai.batches.retrieve(made[0].id).status == "completed"  # the batch outlives its input file


def test_expiry_cancels_what_is_left_and_keeps_the_rest(oai, app, worker):
    """A batch past its 24 h window (moved into the past here) ends `expired`: finished requests in the output
    file, the others in the error file as batch_expired. Output files past their retention are gone."""
    batch, lines = running_batch(oai, "expire")
    Session = app.extensions["jobs"].Session
    with Session.begin() as session:
        session.execute(update(Batch).where(Batch.id == batch.id).values(expires_at=func.now() - timedelta(seconds=1)))
    batch = wait_batch(oai, batch.id, until=("expired",))
    counts = batch.request_counts
    assert batch.expired_at and batch.cancelled_at is None and 0 < counts.completed < 48
    assert counts.completed + counts.failed == 48
    out, errors = read_lines(oai, batch.output_file_id), read_lines(oai, batch.error_file_id)
    assert len(out) == counts.completed and set(out) | set(errors) == {line["custom_id"] for line in lines}
    assert {line["error"]["code"] for line in errors.values()} == {"batch_expired"}

    with Session.begin() as session:
        session.execute(update(File).where(File.id == batch.output_file_id).values(expires_at=func.now()))
    with pytest.raises(openai.NotFoundError):
        oai.files.content(batch.output_file_id)
    assert batch.output_file_id not in [f.id for f in oai.files.list()]

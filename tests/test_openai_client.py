"""The official `openai` Python package (pinned in requirements.txt) against the API served over HTTP by a live
server, with the real worker decoding: models, chat (plain and streamed), completions, the client's exception
classes, and (below) files and batches."""
import threading

import openai
import pytest
from conftest import make_key
from werkzeug.serving import make_server

MODEL = "tiny"  # EAGLE3_TARGET of the test session
SYSTEM = {"role": "system", "content": "You are terse."}


@pytest.fixture(scope="module")
def base_url(app):
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/v1"
    server.shutdown()
    thread.join(10)


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
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == plain.choices[0].finish_reason
    assert chunks[-1].usage.total_tokens == plain.usage.total_tokens


def test_completions_and_stop(oai, worker):
    full = oai.completions.create(model=MODEL, prompt="Count to five.", max_tokens=12, temperature=0)
    text = full.choices[0].text
    assert full.object == "text_completion" and len(text) >= 4
    cut = oai.completions.create(model=MODEL, prompt="Count to five.", max_tokens=12, temperature=0, stop=[text[2:4]])
    assert cut.choices[0].text == text[:text.index(text[2:4])] and cut.choices[0].finish_reason == "stop"
    assert cut.usage.completion_tokens < full.usage.completion_tokens


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

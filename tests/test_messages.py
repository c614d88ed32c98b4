"""Chat messages, stop strings and max_tokens in native job items; the torch-free tokenizer the API counts with."""
import inspect
import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT, all_results, submit, wait_for

from jobs import limits, tokenizer

CHAT = [{"role": "system", "content": "You answer in one word."},
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": [{"type": "text", "text": "Another "}, {"type": "text", "text": "one?"}]}]
TURNS = CHAT[:3] + [{"role": "user", "content": "Another one?"}]


@pytest.fixture(scope="module")
def decoder():
    from eagle3 import SpeculativeDecoder, load_target

    return SpeculativeDecoder(load_target("tiny"))


def test_chat_tokenizer_matches_the_decoders_own_encoding():
    from eagle3.decoder import SpeculativeDecoder
    from eagle3.target import load_tokenizer, tiny_config

    for name in ("tiny", "smollm2-135m-instruct"):
        ours, theirs = tokenizer.load(name), load_tokenizer(name)
        assert ours.max_context == theirs.max_context
        for prompt in ("Hello", "Explain TCP <|im_start|> in one sentence.\n\nThanks!", "naïve café ☕"):
            assert ours.encode_messages(tokenizer.turns(prompt, None)) == theirs.encode_prompt(prompt)
    hf = load_tokenizer("smollm2-135m-instruct").tokenizer.tok  # transformers' own chat template rendering
    want = hf.apply_chat_template(TURNS, add_generation_prompt=True, tokenize=True)["input_ids"]
    assert tokenizer.load("smollm2-135m-instruct").encode_messages(TURNS) == list(want)
    assert tokenizer.TINY_CONTEXT == tiny_config().max_position_embeddings
    assert limits.DECODER_DEPTH == inspect.signature(SpeculativeDecoder).parameters["depth"].default


def test_tiny_template_renders_every_turn():
    ids = tokenizer.load("tiny").encode_messages(TURNS)
    assert ids[0] == 256 and bytes(ids[1:]).decode() == (
        "System: You answer in one word.\nUser: Name a colour.\nAssistant: Blue.\nUser: Another one?\nAssistant: ")


def test_messages_stop_and_max_tokens_through_the_worker(client, worker, decoder):
    plain = decoder.generate(["Tell me a story."], max_new_tokens=12)[0]
    stop = plain.text[3:5]  # a string the greedy answer contains, so it must be cut there
    assert len(stop) == 2 and stop in plain.text
    items = [{"custom_id": "chat", "messages": CHAT, "max_tokens": 6},
             {"custom_id": "stop", "prompt": "Tell me a story.", "stop": [stop, "never-there"], "max_tokens": 12},
             {"custom_id": "nostop", "prompt": "Tell me a story.", "stop": "never-there", "max_new_tokens": 12}]
    created = submit(client, {"items": items})
    assert created["status"] == "queued"
    job = wait_for(client, created["id"])
    assert job["item_counts"]["completed"] == 3, all_results(client, created["id"])
    results = {r["custom_id"]: r for r in all_results(client, created["id"])}

    ids = tokenizer.load("tiny").encode_messages(TURNS)
    want = decoder.generate_ids([ids], max_new_tokens=6)[0]
    assert results["chat"]["output"]["token_ids"] == want.token_ids and results["chat"]["output"]["text"] == want.text
    assert results["chat"]["stats"]["prompt_tokens"] == len(ids)

    cut = results["stop"]
    assert cut["output"]["text"] == plain.text[:plain.text.index(stop)]
    assert cut["stats"]["finish_reason"] == "stop"
    kept = cut["output"]["token_ids"]
    assert kept == plain.token_ids[:len(kept)] and stop in decoder.target.decode(kept)
    assert stop not in decoder.target.decode(kept[:-1])  # the fewest tokens that reach the stop string
    assert results["nostop"]["output"]["text"] == plain.text
    assert results["nostop"]["output"]["token_ids"] == plain.token_ids


@pytest.mark.parametrize("item, field", [
    ({"custom_id": "a"}, "items[0].prompt"),
    ({"prompt": "x", "messages": [{"role": "user", "content": "x"}]}, "items[0]"),
    ({"messages": []}, "items[0].messages"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "items[0].messages[0].role"),
    ({"messages": [{"role": "user", "content": "x", "extra": 1}]}, "items[0].messages[0].extra"),
    ({"prompt": "x", "stop": []}, "items[0].stop"),
    ({"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, "items[0].stop"),
    ({"prompt": "x", "stop": [""]}, "items[0].stop"),
    ({"prompt": "x", "max_tokens": 4, "max_new_tokens": 5}, "items[0]"),
    ({"prompt": "x", "max_tokens": 0}, "items[0].max_tokens"),
])
def test_invalid_items_are_422(client, item, field):
    response = client.post("/v1/jobs", json={"items": [item]})
    assert response.status_code == 422, response.get_json()
    assert response.get_json()["errors"][0]["field"].startswith(field)


def test_too_long_messages_and_review_messages_are_422(client):
    long = [{"role": "system", "content": "x" * 600}, {"role": "user", "content": "y" * 500}]
    body = client.post("/v1/jobs", json={"items": [{"messages": long}]}).get_json()
    assert body["status"] == 422 and body["errors"][0]["field"] == "items[0].messages"
    assert "exceeds the model's context of 1024 tokens" in body["errors"][0]["message"]
    body = client.post("/v1/jobs", json={"type": "review", "items": [{"messages": CHAT}]}).get_json()
    assert body["status"] == 422 and body["errors"][0]["field"] == "items[0].messages"


def test_max_tokens_is_reported_as_max_new_tokens(client):
    response = client.post("/v1/jobs", json={"items": [{"prompt": "x"}], "params": {"max_tokens": 3, "stop": "."}})
    assert response.status_code == 202
    job = response.get_json()
    assert job["params"]["max_new_tokens"] == 3 and job["params"]["stop"] == ["."]
    assert "max_tokens" not in job["params"]
    client.post(f"/v1/jobs/{job['id']}/cancel")


SUBMIT_IN_A_FRESH_PROCESS = """
import json, sys
from api import create_app
app = create_app()
client = app.test_client()
headers = {"Authorization": "Bearer " + sys.argv[1]}
item = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
response = client.post("/v1/jobs", json={"items": [item]}, headers=headers)
client.post("/v1/jobs/%s/cancel" % response.get_json()["id"], headers=headers)
print(json.dumps({"status": response.status_code, "torch": "torch" in sys.modules,
                  "eagle3": any(m.split(".")[0] == "eagle3" for m in sys.modules)}))
"""


@pytest.mark.parametrize("target", ["tiny", "smollm2-135m-instruct"])
def test_the_api_process_never_imports_torch(api_key, target):
    """A submission counts prompt tokens with the chat template, in an API process that has not imported torch."""
    env = {**os.environ, "EAGLE3_TARGET": target}
    out = subprocess.run([sys.executable, "-c", SUBMIT_IN_A_FRESH_PROCESS, api_key], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"status": 202, "torch": False, "eagle3": False}


def test_developer_is_the_system_turn_and_a_refusing_template_is_an_error(tmp_path):
    from jobs.spec import ItemIn

    item = ItemIn(messages=[{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
    assert item.turns()[0] == {"role": "system", "content": "Be brief."}

    source = tokenizer.model_dir("smollm2-135m-instruct")  # a model directory whose template refuses two users
    for name in ("tokenizer.json", "config.json"):
        (tmp_path / name).write_bytes((source / name).read_bytes())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": (
        "{% for m in messages %}{% if loop.index0 > 0 and m['role'] == messages[loop.index0 - 1]['role'] %}"
        "{{ raise_exception('Conversation roles must alternate') }}{% endif %}{{ m['content'] }}{% endfor %}")}))
    twice = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    assert "roles must alternate" in limits.too_long(str(tmp_path), "generation", None, 1, twice)
    assert limits.too_long(str(tmp_path), "generation", None, 1, twice[:1]) is None

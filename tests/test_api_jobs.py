"""Submit -> real worker -> poll -> results, for both job types, plus idempotency, listing, JSONL, /generate."""
import io
import json
import math
import uuid

import pytest
from conftest import RUN_ID, all_results, client_for, prompts, submit, wait_for

from api import create_app
from jobs import review
from jobs.db import session_factory
from jobs.models import Item, Job

PARAMS = {"max_new_tokens": 8}


@pytest.fixture(scope="module")
def decoder():
    """The same tiny target the worker runs, decoded here directly, to check what the worker stored."""
    from eagle3 import SpeculativeDecoder, load_target

    return SpeculativeDecoder(load_target("tiny"))


def test_generation_job(client, worker, decoder):
    items = prompts(10)
    created = submit(client, {"items": items, "params": PARAMS, "metadata": {"team": "search"}})
    assert created["status"] == "queued" and created["item_counts"]["total"] == 10
    assert created["params"]["max_new_tokens"] == 8 and created["params"]["parallel_degree"] == 4

    job = wait_for(client, created["id"])
    assert job["status"] == "completed"
    assert job["item_counts"] == {"total": 10, "completed": 10, "failed": 0, "cancelled": 0}
    assert job["progress"] == 1.0 and job["metadata"] == {"team": "search"}
    assert job["created_at"] <= job["started_at"] <= job["finished_at"]

    results = all_results(client, created["id"])
    assert [r["custom_id"] for r in results] == [i["custom_id"] for i in items]
    expected = decoder.generate([i["prompt"] for i in items], max_new_tokens=8)
    for result, want in zip(results, expected):
        assert result["status"] == "completed" and result["error"] is None
        assert result["output"]["token_ids"] == want.token_ids and result["output"]["text"] == want.text
        assert result["stats"]["speculative"] is True and 1 <= result["stats"]["new_tokens"] <= 8
        assert 1 <= result["stats"]["batch_items"] <= 8
        assert result["baseline_stats"] is None

    stats = job["stats"]
    assert stats["new_tokens"] == sum(r["stats"]["new_tokens"] for r in results)
    assert stats["target_forwards"] == sum(r["stats"]["target_forwards"] for r in results)
    assert stats["decode_time_s"] == pytest.approx(sum(r["stats"]["time_share_s"] for r in results))
    assert stats["tokens_per_s"] == pytest.approx(stats["new_tokens"] / stats["decode_time_s"])
    rounds = sum(r["stats"]["rounds"] for r in results)
    accepted = sum(round(r["stats"]["accept_length"] * r["stats"]["rounds"]) for r in results)
    assert stats["mean_accept_length"] == pytest.approx(accepted / rounds)
    assert stats["speedup_kind"] == "estimated" and stats["baseline_sample_items"] == 0
    assert stats["speedup"] == pytest.approx(stats["new_tokens"] / stats["target_forwards"])
    assert stats["baseline_tokens_per_s"] == pytest.approx(stats["tokens_per_s"] / stats["speedup"])


def test_results_pagination_matches_the_stream(client, worker):
    created = submit(client, {"items": prompts(7, "Page"), "params": {"max_new_tokens": 4}})
    wait_for(client, created["id"])
    pages, cursor = [], None
    while True:
        url = f"/v1/jobs/{created['id']}/results?limit=3" + (f"&after={cursor}" if cursor is not None else "")
        page = client.get(url).get_json()
        pages.append(page["data"])
        if not page["has_more"]:
            assert page["next_cursor"] is None
            break
        cursor = page["next_cursor"]
    assert [len(p) for p in pages] == [3, 3, 1]
    assert [r for p in pages for r in p] == all_results(client, created["id"])


def test_review_job(client, worker, decoder):
    texts = ["Buy cheap watches now!!! Click here: http://spam.example", "I had a lovely walk with my dog today."]
    created = submit(client, {"type": "review", "items": [{"custom_id": f"t{i}", "prompt": t}
                                                          for i, t in enumerate(texts)], "params": PARAMS})
    job = wait_for(client, created["id"])
    assert job["status"] == "completed" and job["type"] == "review"
    for result, text in zip(all_results(client, created["id"]), texts):
        verdict = result["output"]
        assert set(verdict) == {"label", "score", "rationale", "label_scores"}
        assert set(verdict["label_scores"]) == set(review.LABELS)
        assert math.isclose(sum(verdict["label_scores"].values()), 1.0, rel_tol=1e-9)
        # label and score come from the target's probabilities over the labels, not from parsing text:
        logprobs = decoder.score_options(review.classification_prompt(text), list(review.LABELS))
        weights = [math.exp(lp - max(logprobs)) for lp in logprobs]
        probs = dict(zip(review.LABELS, (w / sum(weights) for w in weights)))
        assert verdict["label"] == max(probs, key=probs.get)
        assert verdict["score"] == pytest.approx(probs[verdict["label"]]) == max(verdict["label_scores"].values())
        want = decoder.generate([review.rationale_prompt(text, verdict["label"])], max_new_tokens=8)[0]
        assert verdict["rationale"] == want.text


def test_review_job_with_its_own_labels_and_policy(client, worker, decoder):
    """The job's label set and policy reach the prompt and the scoring, are stored, and come back."""
    options = {"labels": ["allowed", "forbidden", "unsure"], "policy": "Mentions of fruit are forbidden."}
    texts = ["I ate an apple.", "The sky is blue."]
    created = submit(client, {"type": "review", **options, "params": PARAMS,
                              "items": [{"prompt": t} for t in texts]})
    assert created["labels"] == options["labels"] and created["policy"] == options["policy"]
    job = wait_for(client, created["id"])
    assert job["status"] == "completed" and job["labels"] == options["labels"]
    for result, text in zip(all_results(client, created["id"]), texts):
        verdict = result["output"]
        assert set(verdict["label_scores"]) == set(options["labels"]) and verdict["label"] in options["labels"]
        logprobs = decoder.score_options(review.classification_prompt(text, options), options["labels"])
        weights = [math.exp(lp - max(logprobs)) for lp in logprobs]
        probs = dict(zip(options["labels"], (w / sum(weights) for w in weights)))
        assert verdict["label"] == max(probs, key=probs.get)
        assert verdict["label_scores"] == pytest.approx(probs)
        want = decoder.generate([review.rationale_prompt(text, verdict["label"], options)], max_new_tokens=8)[0]
        assert verdict["rationale"] == want.text
    generation = submit(client, {"items": prompts(1), "params": PARAMS})
    assert generation["labels"] is None and generation["policy"] is None


def test_review_job_without_labels_shows_the_builtin_taxonomy(client, database):
    created = submit(client, {"type": "review", "items": [{"prompt": "hello"}], "params": PARAMS})
    assert created["labels"] == list(review.LABELS) and created["policy"] is None
    with session_factory(database)() as session:
        assert session.get(Job, uuid.UUID(created["id"])).options == {}


def test_measure_baseline_stores_a_measured_speedup(client, worker):
    created = submit(client, {"items": prompts(6, "Baseline"), "params": {**PARAMS, "measure_baseline": True}})
    job = wait_for(client, created["id"])
    results = all_results(client, created["id"])
    sampled = [r for r in results if r["baseline_stats"] is not None]
    assert len(sampled) == 4 == job["stats"]["baseline_sample_items"]  # BASELINE_SAMPLE_SIZE=4 in conftest
    for r in sampled:
        assert r["baseline_stats"]["speculative"] is False
        # temperature 0 is lossless: the vanilla run produced the same number of tokens
        assert r["baseline_stats"]["new_tokens"] == r["stats"]["new_tokens"]
    stats = job["stats"]
    spec_tps = sum(r["stats"]["new_tokens"] for r in sampled) / sum(r["stats"]["time_share_s"] for r in sampled)
    base_tps = sum(r["baseline_stats"]["new_tokens"] for r in sampled) / \
        sum(r["baseline_stats"]["time_share_s"] for r in sampled)
    assert stats["speedup_kind"] == "measured"
    assert stats["sample_tokens_per_s"] == pytest.approx(spec_tps)
    assert stats["baseline_tokens_per_s"] == pytest.approx(base_tps)
    assert stats["speedup"] == pytest.approx(spec_tps / base_tps)


def test_idempotency_key_returns_the_same_job(client, worker, database):
    key = f"idem-{RUN_ID}"
    body = {"items": prompts(3, "Idempotent"), "params": PARAMS}
    first = client.post("/v1/jobs", json=body, headers={"Idempotency-Key": key})
    second = client.post("/v1/jobs", json=body, headers={"Idempotency-Key": key})
    assert first.status_code == second.status_code == 202
    assert first.get_json()["id"] == second.get_json()["id"]
    assert "Idempotent-Replayed" not in first.headers and second.headers["Idempotent-Replayed"] == "true"
    job = wait_for(client, first.get_json()["id"])
    third = client.post("/v1/jobs", json=body, headers={"Idempotency-Key": key})
    assert third.get_json()["id"] == job["id"] and third.get_json()["status"] == "completed"
    with session_factory(database)() as session:
        assert session.query(Item).filter(Item.job_id == job["id"]).count() == 3
    assert len(all_results(client, job["id"])) == 3

    changed = client.post("/v1/jobs", json={**body, "priority": 7}, headers={"Idempotency-Key": key})
    assert changed.status_code == 409 and changed.get_json()["job_id"] == job["id"]
    other = submit(client, body)  # no key: a new job
    assert other["id"] != job["id"]


def test_list_jobs_pagination_and_status_filter(client, worker):
    mine = [submit(client, {"items": prompts(1, f"List {i}"), "params": {"max_new_tokens": 2}})["id"]
            for i in range(3)]
    cancelled = submit(client, {"items": prompts(1, "List cancelled"), "params": {"max_new_tokens": 2}})["id"]
    client.post(f"/v1/jobs/{cancelled}/cancel")
    for job_id in mine + [cancelled]:
        wait_for(client, job_id)

    seen, cursor = [], None
    while True:
        page = client.get("/v1/jobs?limit=2" + (f"&after={cursor}" if cursor else "")).get_json()
        assert len(page["data"]) <= 2
        seen += [j["id"] for j in page["data"]]
        if not page["has_more"]:
            break
        cursor = page["next_cursor"]
    assert len(seen) == len(set(seen))  # no job on two pages
    newest_first = [cancelled, *reversed(mine)]
    assert [j for j in seen if j in newest_first] == newest_first

    done = client.get("/v1/jobs?status=completed&limit=100").get_json()["data"]
    assert {j["status"] for j in done} == {"completed"} and set(mine) <= {j["id"] for j in done}
    assert cancelled not in {j["id"] for j in done}
    both = client.get("/v1/jobs?status=completed,cancelled&limit=100").get_json()["data"]
    assert cancelled in {j["id"] for j in both} and {j["status"] for j in both} <= {"completed", "cancelled"}


def test_jsonl_upload(client, worker):
    lines = [json.dumps({"custom_id": f"line-{i}", "prompt": f"Uploaded {i}"}) for i in range(4)]
    data = {"file": (io.BytesIO(("\n".join(lines) + "\n").encode()), "items.jsonl"),
            "job": json.dumps({"params": {"max_new_tokens": 4}, "metadata": {"source": "upload"}})}
    response = client.post("/v1/jobs", data=data, content_type="multipart/form-data")
    assert response.status_code == 202, response.get_json()
    job = wait_for(client, response.get_json()["id"])
    assert job["status"] == "completed" and job["metadata"] == {"source": "upload"}
    assert [r["custom_id"] for r in all_results(client, job["id"])] == [f"line-{i}" for i in range(4)]


def test_generate_is_synchronous(client, worker, decoder):
    response = client.post("/generate", json={"prompt": "Hello, ", "max_new_tokens": 6})
    assert response.status_code == 200, response.get_json()
    body = response.get_json()
    want = decoder.generate(["Hello, "], max_new_tokens=6)[0]
    assert body["text"] == want.text and body["token_ids"] == want.token_ids
    assert body["stats"]["new_tokens"] == len(want.token_ids)
    job = client.get(f"/v1/jobs/{body['job_id']}").get_json()
    assert job["status"] == "completed" and job["priority"] == 9 and job["metadata"] == {"source": "generate"}


def test_generate_times_out_with_504(database):
    client = client_for(create_app({"queue": f"nobody-{RUN_ID}", "generate_timeout_s": 0.5}))
    response = client.post("/generate", json={"prompt": "Nobody serves this queue"})
    body = response.get_json()
    assert response.status_code == 504 and response.mimetype == "application/problem+json"
    assert client.get(f"/v1/jobs/{body['job_id']}").get_json()["status"] == "queued"
    client.post(f"/v1/jobs/{body['job_id']}/cancel")


def test_broker_outage_at_submit_is_503_and_recoverable(client, worker):
    down = client_for(create_app({"redis_url": "redis://127.0.0.1:1/0"}))
    key = f"outage-{RUN_ID}"
    body = {"items": prompts(2, "Outage"), "params": {"max_new_tokens": 2}}
    response = down.post("/v1/jobs", json=body, headers={"Idempotency-Key": key})
    problem = response.get_json()
    assert response.status_code == 503 and problem["title"] == "Broker unavailable"
    assert client.get(f"/v1/jobs/{problem['job_id']}").get_json()["status"] == "queued"  # stored, not lost
    replay = client.post("/v1/jobs", json=body, headers={"Idempotency-Key": key})  # broker back: items sent
    assert replay.status_code == 202 and replay.get_json()["id"] == problem["job_id"]
    assert wait_for(client, problem["job_id"])["status"] == "completed"

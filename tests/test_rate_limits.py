"""Rate limits (Flask-Limiter on the real Redis): per API key, per IP without a key; and the queued-items limit per
key. Each app gets its own Redis key prefix, so these counters touch no other test."""
import secrets

from conftest import RUN_ID, client_for, make_key, prompts, submit

from api import create_app


def limited_app(**overrides):
    return create_app({"rate_limit_key_prefix": f"rl-{RUN_ID}-{secrets.token_hex(4)}",
                       "queue": f"rl-idle-{RUN_ID}", **overrides})


def assert_429(response):
    assert response.status_code == 429 and response.mimetype == "application/problem+json", response.get_data()
    assert 1 <= int(response.headers["Retry-After"]) <= 61
    assert response.get_json()["status"] == 429
    return response.get_json()


def test_requests_per_minute_per_key(database):
    app = limited_app(rate_limit="3/minute")
    first, second = client_for(app, make_key("rl-a")), client_for(app, make_key("rl-b"))
    for _ in range(3):
        assert first.get("/v1/jobs").status_code == 200
    body = assert_429(first.get("/v1/jobs"))
    assert "3 per 1 minute" in body["detail"]
    assert_429(first.post("/v1/jobs", json={"items": prompts(1)}))  # every route counts against the key
    assert second.get("/v1/jobs").status_code == 200  # another key has its own budget
    assert first.get("/health").status_code in (200, 503)  # exempt


def test_unauthenticated_calls_are_limited_per_ip(database):
    app = limited_app(rate_limit_unauthenticated="2/minute")
    anon = app.test_client()
    assert [anon.get("/v1/jobs").status_code for _ in range(2)] == [401, 401]
    assert_429(anon.get("/v1/jobs", headers={"Authorization": "Bearer e3k_guessing"}))
    other_ip = app.test_client()
    other_ip.environ_base["REMOTE_ADDR"] = "10.9.8.7"
    assert other_ip.get("/v1/jobs").status_code == 401
    assert client_for(app).get("/v1/jobs").status_code == 200  # a valid key is counted separately
    assert anon.get("/health").status_code != 429  # this IP is over its limit, but /health is exempt


def test_max_queued_items_per_key(database):
    app = limited_app(max_queued_items_per_key=3)
    api = client_for(app, make_key("quota"))
    job = submit(api, {"items": prompts(2, "Quota")})
    body = assert_429(api.post("/v1/jobs", json={"items": prompts(2, "Quota more")}))
    assert body["title"] == "Too many queued items" and "2 items of this key are queued" in body["detail"]
    assert api.get("/v1/jobs").get_json()["data"][0]["id"] == job["id"]  # nothing was stored
    submit(api, {"items": prompts(1, "Fits")})  # 2 + 1 = 3 is allowed
    assert client_for(app, make_key("quota-other")).post("/v1/jobs", json={"items": prompts(3)}).status_code == 202
    api.post(f"/v1/jobs/{job['id']}/cancel")  # cancelled items no longer count
    submit(api, {"items": prompts(2, "After cancel")})


def test_limiter_storage_down_fails_open(database):
    app = limited_app(rate_limit="1/minute", rate_limit_storage_uri="redis://127.0.0.1:1/0")
    api = client_for(app)
    assert [api.get("/v1/jobs").status_code for _ in range(3)] == [200, 200, 200]

"""Hypothesis fuzzing of every route with hostile input: lone surrogates, NUL, RTL and zero-width characters, huge
and non-finite numbers, deep nesting, wrong JSON types, invalid UTF-8, hostile path ids and query strings. Valid
requests are mutated a few fields at a time, so the fuzzing reaches the checks behind the first ones.

What is asserted: no response >= 500 except the two the API documents for an app whose queue has no worker
(`/generate` 504 Timeout with a job_id, `/health` 503 naming only the missing worker), and every 4xx of the JSON
API is application/problem+json.

Examples per route: FUZZ_EXAMPLES (default 200; routes without input get a few). The cases are the same at every run
(derandomized) unless FUZZ_RANDOM=1. The long run the issue asks for (>= 10,000 requests):
    FUZZ_EXAMPLES=900 FUZZ_RANDOM=1 python -m pytest -q -s tests/test_api_fuzz.py
prints `fuzz: N requests, M responses >= 500 (K documented 503/504)` at the end (and appends it to $FUZZ_REPORT).

The app has a private database and a queue no worker consumes: accepted jobs are stored, never decoded.
"""
from __future__ import annotations

import base64
import copy
import json
import os
from collections import Counter
from urllib.parse import quote

import pytest
from conftest import RUN_ID, client_for
from fault_helpers import private_database
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from api import create_app

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "200"))
STATS: Counter = Counter()  # requests, 5xx, documented
FAILURES: list[str] = []

# ------------------------------------------------------------------------------------------------ strategies
SPECIAL_CHARS = ["\x00", "\ud800", "\udbff", "\udc00", "\udfff", "\u202e", "\u200f", "\u200b", "\ufeff", "\uffff", "\U0010ffff",
                 "\u0085", "\u2028", "\\", '"', "{", " "]
SPECIAL_STRINGS = ["\udc00\ud800", "\ud83d\ude00", "\x1b[31m", "%00", "../../etc/passwd", "'; DROP TABLE jobs;--",
                   "[]", "null", "NaN", "-0", "1e999", ""]
pieces = st.one_of(st.characters(), st.sampled_from(SPECIAL_CHARS), st.sampled_from(SPECIAL_CHARS),
                   st.sampled_from(SPECIAL_STRINGS))
text = st.one_of(st.lists(pieces, max_size=12).map("".join), st.lists(pieces, min_size=1, max_size=4).map("".join), st.sampled_from(SPECIAL_CHARS + SPECIAL_STRINGS),
                 st.builds(lambda s, n: s * n, st.lists(pieces, min_size=1, max_size=3).map("".join),
                           st.integers(100, 5000)))
numbers = st.one_of(st.integers(), st.sampled_from([2**31, 2**63, -(2**63) - 1, 10**100, -1, 0]),
                    st.floats(allow_nan=True, allow_infinity=True))
scalars = st.one_of(st.none(), st.booleans(), numbers, text)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
                      max_leaves=8)
latin1 = st.text(st.characters(max_codepoint=255, exclude_characters="\r\n"), max_size=40)


def deep(n: int) -> bytes:
    return b"[" * n + b"]" * n


raw_bodies = st.one_of(st.integers(500, 100_000).map(deep), st.binary(max_size=64),
                       st.sampled_from([b"", b"{", b"\xff\xfe", b'{"items": "\xc3\x28"}', b"null", b"[]"]))


def paths(value, prefix=()):
    """Every path into a JSON template below its root (containers and leaves), so a mutation can hit any level."""
    children = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, child in children:
        yield prefix + (key,)
        yield from paths(child, prefix + (key,))


# What replaces a field: hostile text for a string (the kind of value that reached a hash or the database before),
# else anything, wrong JSON types included.
replacements = st.one_of(text, text, numbers, st.booleans(), st.none(), values)


@st.composite
def mutated(draw, template):
    """The template with 1-2 changes: a string replaced by hostile text, any value replaced, a hostile key added,
    a key removed; rarely not an object at all."""
    if draw(st.integers(0, 19)) == 0:
        return draw(values)
    body = copy.deepcopy(template)
    for _ in range(draw(st.sampled_from([1, 1, 2]))):
        action = draw(st.sampled_from(["string", "string", "any", "any", "add", "delete"]))
        where = list(paths(body))
        if action == "string":
            where = [p for p in where if isinstance(get(body, p), str)]
        elif action == "add":
            where = [()] + [p for p in where if isinstance(get(body, p), dict)]
        if not where:
            break
        path = draw(st.sampled_from(where))
        if action == "add":
            get(body, path)[draw(text)] = draw(replacements)
        elif action == "delete":
            parent = get(body, path[:-1])
            if isinstance(parent, dict):
                del parent[path[-1]]
        else:
            get(body, path[:-1])[path[-1]] = draw(text if action == "string" else replacements)
    return body


def get(body, path):
    for part in path:
        body = body[part]
    return body


def escaped(body) -> bytes:
    """JSON with \\u escapes, as most clients send it: a lone surrogate arrives as \\udXXX and survives parsing."""
    return json.dumps(body, allow_nan=True).encode()


def encode(body) -> bytes:
    """JSON as raw UTF-8, where a lone surrogate becomes invalid UTF-8."""
    return json.dumps(body, ensure_ascii=False, allow_nan=True).encode("utf-8", "surrogatepass")


def json_bodies(template):
    return st.one_of(mutated(template).map(escaped), mutated(template).map(escaped), mutated(template).map(encode),
                     raw_bodies)


def url_part(value: str) -> str:
    return quote(value.encode("utf-8", "surrogatepass"), safe="")


b64 = st.binary().map(lambda raw: base64.urlsafe_b64encode(raw).decode().rstrip("="))
cursors = st.one_of(
    st.sampled_from([1, 1200, 5000, 100_000]).map(deep),
    st.tuples(st.sampled_from(["2026-01-01T00:00:00+00:00", "0001-01-01", "9999-12-31T23:59:59-23:59"]),
              replacements).map(escaped),
    values.map(escaped), st.binary(max_size=32)).map(lambda raw: base64.urlsafe_b64encode(raw).decode().rstrip("="))
query_values = st.one_of(text, numbers.map(str), cursors, b64)
queries = st.one_of(
    st.fixed_dictionaries({}, optional={"after": query_values, "limit": query_values, "status": query_values,
                                        "format": query_values}),
    st.dictionaries(text, query_values, max_size=3))


def query_string(query: dict) -> str:
    return "&".join(f"{url_part(k)}={url_part(v)}" for k, v in query.items())


JOB = {"type": "generation", "items": [{"custom_id": "a", "prompt": "Hi", "max_new_tokens": 2, "temperature": 0.5}],
       "params": {"max_new_tokens": 2, "top_p": 0.9, "top_k": 3, "seed": 1, "parallel_degree": 2,
                  "validation_threshold": 1.0, "measure_baseline": False},
       "priority": 5, "metadata": {"team": "fuzz"}}
ITEM = JOB["items"][0]
OPTIONS = {k: v for k, v in JOB.items() if k != "items"}
GENERATE = {"prompt": "Hi", "max_new_tokens": 2, "temperature": 0.0, "seed": 3}
SCHEDULE = {"name": "fuzz", "cron": "0 2 * * *", "timezone": "Europe/Berlin", "job": OPTIONS,
            "source": {"kind": "inline", "items": [ITEM]}, "enabled": True}
FILE_SCHEDULE = {**SCHEDULE, "source": {"kind": "file", "path": "fuzz/items.jsonl"}}


@st.composite
def jsonl_upload(draw):
    lines = draw(st.lists(st.one_of(mutated(ITEM).map(escaped), mutated(ITEM).map(encode), raw_bodies),
                          min_size=1, max_size=4))
    job = draw(st.one_of(st.none(), mutated(OPTIONS).map(lambda b: escaped(b).decode()), text))
    body = b"--b\r\nContent-Disposition: form-data; name=\"file\"; filename=\"x.jsonl\"\r\n\r\n" + b"\n".join(lines)
    if job is not None:
        body += b"\r\n--b\r\nContent-Disposition: form-data; name=\"job\"\r\n\r\n" + job.encode("utf-8", "surrogatepass")
    return body + b"\r\n--b--\r\n"


# ------------------------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def fuzz(database, tmp_path_factory):
    """(client, known ids): the app on a private database; a job and a schedule that exist, so the {id} routes are
    also fuzzed past their 404."""
    inputs = tmp_path_factory.mktemp("fuzz-inputs")
    (inputs / "fuzz").mkdir()
    (inputs / "fuzz" / "items.jsonl").write_text('{"prompt": "from a file"}\n')
    with private_database("fz") as url:
        app = create_app({"database_url": url, "queue": f"fuzz-{RUN_ID}", "generate_timeout_s": 0.01,
                          "schedule_input_dir": str(inputs)})
        client = client_for(app)
        job = client.post("/v1/jobs", json=JOB).get_json()["id"]
        schedule = client.post("/v1/schedules", json=SCHEDULE).get_json()["id"]
        yield client, {"job": job, "schedule": schedule}
    report = f"fuzz: {STATS['requests']} requests, {STATS['5xx']} responses >= 500 " \
             f"({STATS['documented']} documented 503/504)"
    print("\n" + report, "; by status:", sorted((k, v) for k, v in STATS.items() if isinstance(k, int)))
    if os.environ.get("FUZZ_REPORT"):
        with open(os.environ["FUZZ_REPORT"], "a") as out:
            out.write(report + "\n")


def documented(path: str, response) -> bool:
    """The 5xx an app without a worker answers by design (see the module docstring)."""
    body = response.get_json(silent=True) or {}
    if path == "/generate" and response.status_code == 504:
        return body.get("title") == "Timeout" and bool(body.get("job_id"))
    if path == "/health" and response.status_code == 503:
        return body.get("detail") == "failed: workers"
    return False


HTML_ROUTES = ("/", "/login", "/logout")  # the status page answers its form with HTML, by design


def call(client, method: str, path: str, query: dict | None = None, body: bytes | None = None,
         content_type: str = "application/json", headers: dict | None = None):
    """One request; records it, and any 5xx or a 4xx that is not a problem, without stopping the run."""
    url = path + ("?" + query_string(query) if query else "")
    response = client.open(url, method=method, data=body, content_type=content_type, headers=headers or {})
    STATS["requests"] += 1
    STATS[response.status_code] += 1
    plain_path = path.split("?")[0]
    if response.status_code >= 500:
        if documented(plain_path, response):
            STATS["documented"] += 1
        else:
            STATS["5xx"] += 1
            FAILURES.append(f"{method} {url[:300]!r} body={body and body[:300]!r} -> {response.status_code} "
                            f"{response.get_data()[:300]!r}")
    elif response.status_code >= 400 and plain_path not in HTML_ROUTES:
        if response.mimetype != "application/problem+json":
            FAILURES.append(f"{method} {url[:300]!r} -> {response.status_code} {response.mimetype}, not a problem")
    return response


def run(strategy, examples: int = EXAMPLES):
    """Drive `strategy` (each example is a zero-argument request) and fail with the first recorded failures."""
    FAILURES.clear()

    @given(request=strategy)
    @settings(max_examples=examples, deadline=None, database=None, derandomize=not os.environ.get("FUZZ_RANDOM"),
              suppress_health_check=list(HealthCheck))
    def check(request):
        request()

    check()
    assert not FAILURES, f"{len(FAILURES)} failures, first ones:\n" + "\n".join(FAILURES[:5])


def ids(kind: str, known: dict):
    """A path id: the known one, or a hostile string."""
    return st.one_of(st.just(known[kind]), text.filter(bool).map(url_part))


idempotency = st.one_of(st.none(), latin1).map(lambda k: {} if k is None else {"Idempotency-Key": k})


# ------------------------------------------------------------------------------------------------ one test per route
def test_post_jobs(fuzz):
    client, _ = fuzz
    run(st.one_of(
        st.builds(lambda b, h: lambda: call(client, "POST", "/v1/jobs", body=b, headers=h), json_bodies(JOB),
                  idempotency),
        st.builds(lambda b: lambda: call(client, "POST", "/v1/jobs", body=b,
                                         content_type="multipart/form-data; boundary=b"), jsonl_upload()),
        st.builds(lambda b, ct: lambda: call(client, "POST", "/v1/jobs", body=b, content_type=ct),
                  raw_bodies, latin1)))


def test_get_jobs(fuzz):
    client, _ = fuzz
    run(st.builds(lambda q: lambda: call(client, "GET", "/v1/jobs", query=q),
                  st.one_of(queries, st.fixed_dictionaries({"after": cursors}))))


@pytest.mark.parametrize("method,suffix", [("GET", ""), ("GET", "/results"), ("POST", "/cancel")])
def test_job_routes(fuzz, method, suffix):
    client, known = fuzz
    run(st.builds(lambda i, q: lambda: call(client, method, f"/v1/jobs/{i}{suffix}", query=q),
                  ids("job", known), queries))


def test_generate(fuzz):
    client, _ = fuzz
    run(st.builds(lambda b: lambda: call(client, "POST", "/generate", body=b), json_bodies(GENERATE)))


def test_post_schedules(fuzz):
    client, _ = fuzz
    run(st.builds(lambda b: lambda: call(client, "POST", "/v1/schedules", body=b),
                  st.one_of(json_bodies(SCHEDULE), json_bodies(FILE_SCHEDULE))))


def test_schedule_routes(fuzz):
    client, known = fuzz
    patches = st.one_of(json_bodies({"name": "n", "enabled": False}), json_bodies(SCHEDULE))
    run(st.one_of(
        st.builds(lambda q: lambda: call(client, "GET", "/v1/schedules", query=q), queries),
        st.builds(lambda i: lambda: call(client, "GET", f"/v1/schedules/{i}"), ids("schedule", known)),
        st.builds(lambda i, b: lambda: call(client, "PATCH", f"/v1/schedules/{i}", body=b),
                  ids("schedule", known), patches),
        st.builds(lambda i: lambda: call(client, "DELETE", f"/v1/schedules/{i}"), text.filter(bool).map(url_part))))


def test_open_and_status_page_routes(fuzz):
    client, _ = fuzz
    run(st.one_of(
        st.builds(lambda q: lambda: call(client, "GET", "/", query=q), queries),
        st.builds(lambda k: lambda: call(client, "POST", "/login", body=f"key={url_part(k)}".encode(),
                                         content_type="application/x-www-form-urlencoded"), text),
        st.builds(lambda q: lambda: call(client, "POST", "/logout", query=q), queries),
        st.builds(lambda q: lambda: call(client, "GET", "/metrics", query=q), queries),
        st.builds(lambda q: lambda: call(client, "GET", "/openapi.json", query=q), queries)))
    run(st.builds(lambda q: lambda: call(client, "GET", "/health", query=q), queries), examples=3)  # ~1 s each


def test_unknown_routes_methods_and_keys(fuzz):
    client, known = fuzz
    methods = st.sampled_from(["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "PROPFIND"])
    routes = st.one_of(st.sampled_from(["/v1/jobs", f"/v1/jobs/{known['job']}", "/generate", "/v1/schedules",
                                        "/v1", "/v1/", "/static/x"]),
                       text.map(lambda t: "/" + url_part(t)), text.map(lambda t: "/v1/jobs/" + url_part(t) + "/x"))
    auth = st.one_of(latin1.map(lambda k: {"Authorization": f"Bearer {k}"}), latin1.map(lambda k: {"Authorization": k}))
    run(st.builds(lambda m, r, b, h: lambda: call(client, m, r, body=b, headers=h), methods, routes, raw_bodies,
                  auth))

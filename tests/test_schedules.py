"""Scheduled jobs: /v1/schedules CRUD and validation, and the dispatcher driven with a frozen clock (exactly one
job per due time, even with two dispatchers at once; only the latest missed due time after downtime)."""
import threading
from datetime import timedelta
from zoneinfo import ZoneInfo

import pytest
from conftest import RUN_ID, client_for, make_key
from sqlalchemy import func, select, update

from api import create_app
from jobs import schedules
from jobs.db import session_factory
from jobs.models import Item, Job, Schedule, ScheduleRun
from jobs.queue import DISPATCH_TASK, celery_app

NIGHTLY = {"name": "nightly", "cron": "0 2 * * *", "timezone": "Europe/Berlin",
           "job": {"type": "generation", "params": {"max_new_tokens": 4}, "metadata": {"team": "search"}},
           "source": {"kind": "inline", "items": [{"custom_id": "a", "prompt": "Nightly one."},
                                                  {"custom_id": "b", "prompt": "Nightly two."}]}}


@pytest.fixture(scope="module")
def input_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("inputs")


@pytest.fixture(scope="module")
def app(database, input_dir):
    # A queue nobody consumes (the jobs are only counted here), and a file-source directory.
    return create_app({"queue": f"sched-{RUN_ID}", "schedule_input_dir": str(input_dir)})


@pytest.fixture
def api(app):
    return client_for(app, make_key("scheduler"))


@pytest.fixture
def Session(database):
    return session_factory(database)


def run(app, now):
    s = app.extensions["jobs"]
    return schedules.dispatch(s.Session, s.celery, s.settings, now=now)


def mine(results, schedule_id):
    return [r for r in results if str(r.schedule_id) == schedule_id]


def jobs_of(Session, schedule_id):
    with Session() as session:
        return session.scalars(select(Job).where(Job.schedule_id == schedule_id).order_by(Job.created_at)).all()


def create(api, body):
    response = api.post("/v1/schedules", json=body)
    assert response.status_code == 201, response.get_json()
    return response.get_json()


def test_crud_and_isolation(api, app):
    created = create(api, NIGHTLY)
    assert created["cron"] == "0 2 * * *" and created["source"]["item_count"] == 2 and created["enabled"]
    assert created["next_due_at"] and created["last_due_at"] is None
    assert created["next_due_at"] == schedules.next_due("0 2 * * *", "Europe/Berlin", _utcnow()).isoformat()
    path = f"/v1/schedules/{created['id']}"
    assert api.get(path).get_json()["runs"] == []
    assert created["id"] in [s["id"] for s in api.get("/v1/schedules").get_json()["data"]]

    other = client_for(app, make_key("other"))
    assert other.get(path).status_code == 404 and other.patch(path, json={"enabled": False}).status_code == 404
    assert other.delete(path).status_code == 404
    assert created["id"] not in [s["id"] for s in other.get("/v1/schedules").get_json()["data"]]

    patched = api.patch(path, json={"enabled": False, "cron": "30 3 * * 1"})
    assert patched.status_code == 200, patched.get_json()
    assert patched.get_json()["enabled"] is False and patched.get_json()["cron"] == "30 3 * * 1"
    assert api.patch(path, json={"cron": "nope"}).status_code == 422
    assert api.delete(path).status_code == 204
    assert api.get(path).status_code == 404


def test_a_schedule_needs_only_a_name_and_items_and_defaults_to_nightly_at_two(api):
    created = create(api, {"name": "defaults", "source": {"kind": "inline", "items": [{"prompt": "Hi"}]}})
    assert (created["cron"], created["timezone"]) == ("0 2 * * *", "UTC")
    api.delete(f"/v1/schedules/{created['id']}")


@pytest.mark.parametrize("change,field", [
    ({"cron": "61 * * * *"}, "cron"), ({"cron": "* * * *"}, "cron"), ({"cron": "* * * * * *"}, "cron"),
    ({"cron": "0 0 30 2 *"}, "cron"), ({"cron": "*/0 * * * *"}, "cron"),
    ({"timezone": "Mars/Olympus"}, "timezone"), ({"timezone": "../../etc/passwd"}, "timezone"),
    ({"source": {"kind": "file", "path": "../escape.jsonl"}}, "source.path"),
    ({"source": {"kind": "file", "path": "/etc/passwd"}}, "source.path"),
    ({"source": {"kind": "url", "url": "http://example.com/x.jsonl"}}, "source"),
    ({"source": {"kind": "inline", "items": []}}, "source.inline.items"),
    ({"source": {"kind": "inline", "items": [{"prompt": "x", "max_new_tokens": 100000}]}},
     "source.items[0].max_new_tokens"),
    ({"job": {"params": {"temperature": -1}}}, "job.params.temperature"),
    ({"name": ""}, "name"), ({"surprise": 1}, "surprise"),
    ({"job": {"labels": ["spam", "ok"]}}, "job.labels"),  # a generation job takes no labels
    ({"job": {"type": "review", "labels": ["spam"]}}, "job.labels"),
])
def test_invalid_schedules_are_422(api, change, field):
    response = api.post("/v1/schedules", json={**NIGHTLY, **change})
    assert response.status_code == 422 and response.mimetype == "application/problem+json", response.get_json()
    assert response.get_json()["errors"][0]["field"] == field


FILE_SOURCE = {"kind": "file", "path": "nightly/items.jsonl"}
SEVENTEEN_KEYS = {f"k{i}": "v" for i in range(17)}


@pytest.mark.parametrize("change,field", [
    ({"name": "night\u0000ly"}, "name"),
    ({"name": "\udfff"}, "name"),
    ({"cron": "0 2 * * *\u0000"}, "cron"),
    ({"timezone": "UTC\u0000"}, "timezone"),
    ({"job": {"metadata": {"team": "a\u0000b"}}}, "job.metadata"),
    ({"job": {"metadata": {"\ud800": "v"}}}, "job.metadata"),
    ({"job": {"metadata": SEVENTEEN_KEYS}}, "job.metadata"),
    ({"job": {"metadata": {"team": "a\u0000b"}}, "source": FILE_SOURCE}, "job.metadata"),
    ({"job": {"metadata": SEVENTEEN_KEYS}, "source": FILE_SOURCE}, "job.metadata"),  # else every run would fail
    ({"job": {"params": {"max_new_tokens": 100000}}, "source": FILE_SOURCE}, "job.params.max_new_tokens"),
    ({"job": {"priority": "7"}}, "job.priority"),
    ({"enabled": "yes"}, "enabled"),
    ({"source": {"kind": "inline", "items": [{"custom_id": "\udfff", "prompt": "x"}]}},
     "source.inline.items[0].custom_id"),
    ({"source": {"kind": "file", "path": "a\u0000b"}}, "source.file.path"),
])
def test_hostile_schedules_are_422_and_store_nothing(api, Session, change, field):
    """NUL, lone surrogates, too many metadata keys, loose types: 422 at creation and at PATCH, never a 500, and
    nothing stored. The JSON is sent as text so that the escapes reach the server as JSON wrote them."""
    import json

    with Session() as session:
        before = session.scalar(select(func.count()).select_from(Schedule))
    raw = json.dumps({**NIGHTLY, **change}, ensure_ascii=True)
    response = api.post("/v1/schedules", data=raw, content_type="application/json")
    assert response.status_code == 422 and response.mimetype == "application/problem+json", response.get_json()
    assert response.get_json()["errors"][0]["field"] == field
    with Session() as session:
        assert session.scalar(select(func.count()).select_from(Schedule)) == before

    created = create(api, NIGHTLY)
    path = f"/v1/schedules/{created['id']}"
    response = api.patch(path, data=json.dumps(change, ensure_ascii=True), content_type="application/json")
    assert response.status_code == 422 and response.mimetype == "application/problem+json", response.get_json()
    assert api.get(path).get_json()["name"] == NIGHTLY["name"]
    api.delete(path)


def test_too_many_inline_items_is_413(database):
    api = client_for(create_app({"max_items_per_job": 2}))
    response = api.post("/v1/schedules", json={**NIGHTLY, "source": {"kind": "inline", "items": [
        {"prompt": f"p{i}"} for i in range(3)]}})
    assert response.status_code == 413 and response.get_json()["errors"][0]["field"] == "source.items"


def test_file_sources_need_the_input_dir(database):
    api = client_for(create_app({"schedule_input_dir": ""}))
    response = api.post("/v1/schedules", json={**NIGHTLY, "source": {"kind": "file", "path": "items.jsonl"}})
    assert response.status_code == 422 and "disabled" in response.get_json()["detail"]
    assert api.post("/v1/schedules", data="{", content_type="application/json").status_code == 400
    assert api.get("/v1/schedules/not-a-uuid").status_code == 404


def test_a_review_schedule_runs_jobs_with_its_labels_and_policy(api, app, Session):
    review = {"type": "review", "labels": ["ok", "off-topic"], "policy": "Cooking only."}
    created = create(api, {**NIGHTLY, "job": review})
    assert created["job"]["labels"] == review["labels"] and created["job"]["policy"] == review["policy"]
    due = schedules.next_due("0 2 * * *", "Europe/Berlin", _utcnow())
    [done] = mine(run(app, due + timedelta(seconds=20)), created["id"])
    assert done.error is None
    job = api.get(f"/v1/jobs/{done.job_id}").get_json()
    assert job["type"] == "review" and job["labels"] == review["labels"] and job["policy"] == review["policy"]
    api.delete(f"/v1/schedules/{created['id']}")


def test_dispatcher_runs_each_due_time_once_and_catches_up_only_the_latest(api, app, Session):
    created = create(api, NIGHTLY)
    first_due = schedules.next_due("0 2 * * *", "Europe/Berlin", schedules.latest_due("* * * * *", "UTC",
                                                                                      _utcnow()))
    assert first_due.astimezone(ZoneInfo("Europe/Berlin")).hour == 2

    assert mine(run(app, first_due - timedelta(minutes=1)), created["id"]) == []  # not due yet
    [done] = mine(run(app, first_due + timedelta(seconds=20)), created["id"])
    assert done.due_at == first_due and done.error is None
    assert mine(run(app, first_due + timedelta(seconds=80)), created["id"]) == []  # the same due time: once
    [job] = jobs_of(Session, created["id"])
    assert job.id == done.job_id and job.total_items == 2 and job.metadata_ == {"team": "search"}

    # The job is an ordinary job of the schedule's key, items queued on the broker.
    seen = api.get(f"/v1/jobs/{job.id}").get_json()
    assert seen["status"] == "queued" and seen["params"]["max_new_tokens"] == 4
    with Session() as session:
        assert session.scalar(select(func.count()).select_from(Item)
                              .where(Item.job_id == job.id, Item.enqueued_at.is_not(None))) == 2

    # Down for four nights: one job, for the latest missed 02:00, not four.
    later = first_due + timedelta(days=4, hours=5)
    [caught_up] = mine(run(app, later), created["id"])
    assert caught_up.due_at == first_due + timedelta(days=4)
    assert mine(run(app, later + timedelta(minutes=1)), created["id"]) == []
    assert len(jobs_of(Session, created["id"])) == 2
    runs = api.get(f"/v1/schedules/{created['id']}").get_json()["runs"]
    assert [r["due_at"] for r in runs] == [caught_up.due_at.isoformat(), first_due.isoformat()]
    assert all(r["job_id"] and r["error"] is None for r in runs)
    api.delete(f"/v1/schedules/{created['id']}")
    assert len(jobs_of(Session, created["id"])) == 0  # the schedule is gone; its jobs stay, unlinked
    assert api.get(f"/v1/jobs/{job.id}").status_code == 200


def test_two_concurrent_dispatchers_create_exactly_one_job(api, app, Session):
    created = create(api, {**NIGHTLY, "cron": "*/5 * * * *", "timezone": "UTC"})
    now = schedules.next_due("*/5 * * * *", "UTC", _utcnow()) + timedelta(seconds=10)
    barrier, results = threading.Barrier(2), []

    def dispatcher():
        barrier.wait()
        results.extend(mine(run(app, now), created["id"]))

    threads = [threading.Thread(target=dispatcher) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(results) == 1 and len(jobs_of(Session, created["id"])) == 1

    # Even a dispatcher that missed the row lock and last_due_at (say, a stale copy) is stopped by the unique
    # (schedule_id, due_at) run row.
    with Session.begin() as session:
        session.execute(update(Schedule).where(Schedule.id == created["id"]).values(last_due_at=None))
    assert mine(run(app, now), created["id"]) == []
    assert len(jobs_of(Session, created["id"])) == 1
    with Session() as session:
        assert session.scalar(select(func.count()).select_from(ScheduleRun)
                              .where(ScheduleRun.schedule_id == created["id"])) == 1
    api.delete(f"/v1/schedules/{created['id']}")


def test_file_source_is_read_at_each_run(api, app, Session, input_dir):
    (input_dir / "nightly").mkdir()
    (input_dir / "nightly" / "items.jsonl").write_text('{"custom_id": "f1", "prompt": "From a file."}\n\n'
                                                       '{"custom_id": "f2", "prompt": "Line three."}\n')
    created = create(api, {**NIGHTLY, "cron": "0 * * * *", "timezone": "UTC",
                           "source": {"kind": "file", "path": "nightly/items.jsonl"}})
    due = schedules.next_due("0 * * * *", "UTC", _utcnow())
    [done] = mine(run(app, due + timedelta(seconds=5)), created["id"])
    assert done.error is None
    with Session() as session:
        assert session.scalars(select(Item.custom_id).where(Item.job_id == done.job_id).order_by(Item.idx)).all() \
            == ["f1", "f2"]

    (input_dir / "nightly" / "items.jsonl").write_text('{"prompt": "ok"}\n{"prompt": \n')  # broken the next hour
    [bad] = mine(run(app, due + timedelta(hours=1, seconds=5)), created["id"])
    assert bad.job_id is None and "line 2: not valid JSON" in bad.error
    (input_dir / "nightly" / "items.jsonl").unlink()
    [missing] = mine(run(app, due + timedelta(hours=2, seconds=5)), created["id"])
    assert missing.job_id is None and "cannot read the input file" in missing.error
    runs = api.get(f"/v1/schedules/{created['id']}").get_json()["runs"]
    assert [bool(r["error"]) for r in runs] == [True, True, False]
    api.delete(f"/v1/schedules/{created['id']}")


def test_beat_runs_the_dispatcher_every_minute():
    import worker  # noqa: F401  (registers the tasks)

    entry = celery_app.conf.beat_schedule["dispatch-schedules"]
    assert entry["task"] == DISPATCH_TASK and entry["schedule"] == 60.0
    assert DISPATCH_TASK in celery_app.tasks
    assert celery_app.amqp.router.route({}, DISPATCH_TASK)["queue"].name.endswith(".maint")


def _utcnow():
    from datetime import datetime, timezone

    return datetime.now(timezone.utc)

"""/health: database, broker and a worker on the batch queue; 503 naming what failed."""
from conftest import RUN_ID, WorkerProcess, client_for

from api import create_app


def test_health_ok_with_the_worker_up(client, worker):
    response = client.get("/health")
    assert response.status_code == 200, response.get_json()
    checks = response.get_json()["checks"]
    assert checks["database"] == {"ok": True} and checks["broker"] == {"ok": True}
    assert worker.name in checks["workers"]["workers"]


def test_health_follows_a_worker_going_down(database, tmp_path):
    queue = f"health-{RUN_ID}"
    client = client_for(create_app({"queue": queue}))
    down = client.get("/health")
    assert down.status_code == 503 and down.mimetype == "application/problem+json"
    assert down.get_json()["checks"]["workers"]["ok"] is False

    proc = WorkerProcess(queue, tmp_path / "worker.log")
    try:
        proc.wait_ready()
        up = client.get("/health")
        assert up.status_code == 200, up.get_json()
        assert up.get_json()["checks"]["workers"]["workers"] == [proc.name]
    finally:
        proc.stop()
    again = client.get("/health")
    body = again.get_json()
    assert again.status_code == 503 and body["detail"] == "failed: workers"
    assert body["checks"]["database"]["ok"] and body["checks"]["broker"]["ok"]
    assert queue in body["checks"]["workers"]["error"]


def test_health_reports_the_broker_down(database):
    response = client_for(create_app({"redis_url": "redis://127.0.0.1:1/0"})).get("/health")
    body = response.get_json()
    assert response.status_code == 503 and body["detail"] == "failed: broker, workers"
    assert body["checks"]["database"]["ok"] is True and body["checks"]["broker"]["ok"] is False


def test_health_reports_the_database_down(database):
    url = "postgresql+psycopg://root@127.0.0.1:1/nothing"
    response = client_for(create_app({"database_url": url}), key=None).get("/health")  # open: no key
    body = response.get_json()
    assert response.status_code == 503 and body["checks"]["database"]["ok"] is False
    assert "database" in body["detail"] and body["checks"]["broker"]["ok"] is True

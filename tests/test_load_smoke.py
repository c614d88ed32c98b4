"""A small run of the load test (bench/load.py) so CI exercises it end to end: gunicorn on loopback under a mixed
submit/poll load, a job through a real worker, and the exactly-once check of every item. Latency is printed, not
asserted (CI machines are shared and noisy); bench/results/load.md has the full-size run."""
import pytest
from conftest import SERVER_URL

from bench import load


@pytest.mark.timeout(300)
def test_load_smoke(tmp_path, capsys):
    result = load.main(["--rate", "50", "--duration", "2", "--warmup", "1", "--items", "200", "--batch-size", "32",
                        "--database-url", SERVER_URL.render_as_string(hide_password=False),
                        "--out", str(tmp_path / "load.md"), "--logs", str(tmp_path / "logs")])
    check = result["check"]
    assert check["ok"], check
    assert check["items"] >= 200 and check["results"] == check["items"] and check["failed"] == 0
    routes = {r["route"]: r for r in result["routes"]}
    assert routes["all"]["requests"] == 100 and routes["all"]["non_2xx"] == 0
    assert result["items_per_s"] > 0
    report = (tmp_path / "load.md").read_text()
    assert "| POST /v1/jobs |" in report and "**OK**" in report
    with capsys.disabled():
        print("\n" + "\n".join(line for line in report.splitlines() if line.startswith("| ")))

"""An operator tells a failed job from a succeeded one at a glance: Flower's task list
(its API, and its page in a real headless Chromium) and the worker log show each job's
own status, exit code, duration and the backend that ran it."""

from __future__ import annotations

import shutil

import pytest

from tests.browserkit import ARTIFACTS, chromium
from tests.conftest import require
from tests.farmkit import SANDFARM, Farm, farm_db, running_flower, wait_for  # noqa: F401

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def flower_farm(farm_db: str, tmp_path, is_root: bool):  # noqa: F811
    pytest.importorskip("requests")
    require(is_root, "the farm's sandbox slots need root")
    require(shutil.which("chromium") is not None, "Debian's chromium is not installed")
    farm = Farm(farm_db, tmp_path)
    worker = farm.start_worker("fl", 2)
    try:
        with running_flower(farm) as base:
            yield farm, worker, base
    finally:
        farm.stop()


def test_flower_and_the_log_show_each_jobs_status(flower_farm) -> None:
    import requests

    farm, worker, base = flower_farm
    with farm.client() as client:
        ids = {
            "ok": client.submit({"code": "print('fine')"}),
            "fail": client.submit({"command": "exit 3"}),
            "slow": client.submit({"command": "sleep 10", "limits": {"timeout_s": 1}}),
        }
        results = {r.id: r for r in client.as_completed(list(ids.values()), timeout=60)}
        tenant = client.tenant
    assert [results[ids[k]].status.value for k in ("ok", "fail", "slow")] == [
        "succeeded",
        "failed",
        "timed_out",
    ]

    def listed() -> dict | None:
        data = requests.get(f"{base}/api/tasks", timeout=10).json()
        qids = {k: f"{tenant}/{v}" for k, v in ids.items()}
        mine = {k: data[q] for k, q in qids.items() if data.get(q, {}).get("result")}
        return mine if len(mine) == len(ids) else None

    tasks = wait_for(listed, 30, 0.5, "flower lists the three jobs with results")
    assert tasks["ok"]["result"].startswith("'succeeded"), tasks["ok"]
    assert tasks["fail"]["result"].startswith("'failed exit=3"), tasks["fail"]
    assert tasks["slow"]["result"].startswith("'timed_out"), tasks["slow"]
    for task in tasks.values():
        assert task["result"].rstrip("'").endswith("process")  # the backend that ran it
        assert "backend=process" in task["args"] and "backend=default" not in task["args"]
    log = worker.log.read_text()
    assert f"[{tenant}/{ids['fail']}] ran in" in log and "failed exit=3" in log
    assert "] succeeded" not in log

    # The task list as an operator sees it, in a real browser.
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "flower-tasks.png"
    shot.unlink(missing_ok=True)
    budget = ["--virtual-time-budget=10000", "--window-size=1600,900"]
    taken = chromium(*budget, f"--screenshot={shot}", f"{base}/tasks")
    assert shot.exists() and shot.stat().st_size > 10_000, taken.stderr[-2000:]
    dom = chromium(*budget, "--dump-dom", f"{base}/tasks").stdout
    assert "failed exit=3" in dom and "timed_out" in dom and "succeeded" in dom, dom[-3000:]

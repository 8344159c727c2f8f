"""Chains through a real worker: a slot runs the next dispatched jobs itself, as it
stores the last one's result (worker/chain.py), and each of those jobs is still its own
task for Flower (its events) and for the worker log; a warm shutdown stops a chain at
its current job, and the jobs it had not taken are run by the next worker, once each."""

from __future__ import annotations

import json
import signal
import threading
import time

import pytest
import redis

from sandbox_core import Status
from tests.farmkit import (  # noqa: F401
    Farm,
    collect_once,
    farm_db,
    make_farm,
    running_flower,
    wait_for,
)

pytestmark = pytest.mark.timeout(180)


def chained(client) -> int:
    return int(client.redis.hget(client.keys.stats, "chained") or 0)


class EventTap:
    """Every task event published on the farm's Redis DB (as Flower receives them)."""

    def __init__(self, url: str) -> None:
        self.client = redis.Redis.from_url(url)
        self.pubsub = self.client.pubsub()
        db = self.client.connection_pool.connection_kwargs.get("db") or 0
        self.pubsub.psubscribe(f"/{db}.celeryev/*")
        self.events: list[dict] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import base64

        while not self._stop.is_set():
            message = self.pubsub.get_message(timeout=0.1)
            if not message or message["type"] != "pmessage":
                continue
            envelope = json.loads(message["data"])
            body = envelope["body"]
            if envelope["properties"].get("body_encoding") == "base64":
                body = base64.b64decode(body)
            payload = json.loads(body)
            self.events += payload if isinstance(payload, list) else [payload]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.pubsub.close()
        self.client.close()

    def of_type(self, kind: str) -> dict[str, dict]:
        return {e["uuid"]: e for e in list(self.events) if e.get("type") == kind}


def test_a_slot_runs_a_batch_in_chains_and_each_job_stays_its_own_task(make_farm) -> None:  # noqa: F811
    farm: Farm = make_farm()
    worker = farm.start_worker("chain", 1)
    tap = EventTap(farm.redis_url)
    try:
        time.sleep(0.3)  # subscribed
        with farm.client() as client:
            specs = [{"command": f"echo {i}", "labels": {"i": str(i)}} for i in range(12)]
            specs.append({"command": "exit 3"})
            ids = client.submit_many(specs)
            results = collect_once(client, ids, 60, farm)
            for i, job_id in enumerate(ids[:-1]):
                assert results[job_id].status == Status.SUCCEEDED
                assert results[job_id].steps[0].stdout == f"{i}\n"
            assert results[ids[-1]].status == Status.FAILED
            # The slot took most of them itself: fewer Celery messages than jobs.
            assert chained(client) >= 8, chained(client)
            qids = [client.jobs.qid(i) for i in ids]
            tenant = client.tenant

        def all_reported() -> dict | None:
            done = tap.of_type("task-succeeded")
            return done if all(q in done for q in qids) else None

        succeeded = wait_for(all_reported, 20, 0.1, "a task-succeeded event for every job")
        received = tap.of_type("task-received")
        for i, qid in enumerate(qids):
            assert qid in received and received[qid]["name"] == "sandfarm.execute"
            assert f"tenant={tenant}" in received[qid]["args"]
            assert "backend=default" not in received[qid]["args"]
            expected = "'failed exit=3" if i == len(qids) - 1 else "'succeeded"
            assert succeeded[qid]["result"].startswith(expected), succeeded[qid]
            assert succeeded[qid]["hostname"] == worker.name
        log = worker.log.read_text()
        for qid in qids:  # one "ran in" line per job, chained or not
            assert f"[{qid}] ran in" in log, qid
    finally:
        tap.close()


def test_flower_lists_the_jobs_a_chain_ran(make_farm) -> None:  # noqa: F811
    pytest.importorskip("requests")
    import requests

    farm: Farm = make_farm()
    farm.start_worker("fchain", 1)
    with running_flower(farm) as base, farm.client() as client:
        before = chained(client)
        ids = client.submit_many([{"command": f"echo {i}"} for i in range(6)])
        collect_once(client, ids, 60, farm)
        assert chained(client) > before  # some came by a chain
        qids = {client.jobs.qid(i) for i in ids}

        def listed() -> dict | None:
            tasks = requests.get(f"{base}/api/tasks", timeout=10).json()
            mine = {q: tasks[q] for q in qids if tasks.get(q, {}).get("result")}
            return mine if len(mine) == len(qids) else None

        tasks = wait_for(listed, 30, 0.5, "flower lists every job with its result")
        for task in tasks.values():
            assert task["state"] == "SUCCESS" and task["result"].startswith("'succeeded")
            assert task["result"].rstrip("'").endswith("process")


def remote_shutdown(farm: Farm, worker_name: str) -> None:
    """`celery control shutdown` to one worker: Celery's remote command, no signal."""
    from celery import Celery

    app = Celery("stopper", broker=farm.redis_url, set_as_current=False)
    try:
        app.control.shutdown(destination=[worker_name])
    finally:
        app.close()


@pytest.mark.parametrize("how", ["sigterm", "remote_control"])
def test_a_warm_shutdown_stops_a_chain_and_loses_no_job(make_farm, how: str) -> None:  # noqa: F811
    farm: Farm = make_farm()
    worker = farm.start_worker("stopping", 1)
    with farm.client() as client:
        ids = client.submit_many([{"command": f"sleep 0.2; echo {i}"} for i in range(40)])
        wait_for(lambda: chained(client) >= 2, 30, 0.05, "a chain under way")
        done_when_asked = len(client.results(ids))
        if how == "sigterm":
            worker.proc.send_signal(signal.SIGTERM)
        else:
            remote_shutdown(farm, worker.name)
        worker.proc.wait(30)
        # It stopped after its current job (a step may have taken one more as the signal
        # came), not after the rest of its chain: 5 s more of 0.2 s jobs would be ~20.
        finished = client.results(ids)
        assert 0 < len(finished) <= done_when_asked + 2, (done_when_asked, len(finished))
        farm.start_worker("next", 1)
        results = collect_once(client, ids, 90, farm)
        for i, job_id in enumerate(ids):
            assert results[job_id].status == Status.SUCCEEDED
            assert results[job_id].steps[0].stdout == f"{i}\n"
            assert results[job_id].attempts == 1  # none ran twice
        assert client.status()["duplicates"] == 0


def test_chains_off_one_message_per_job(make_farm) -> None:  # noqa: F811
    farm: Farm = make_farm(SANDFARM_CHAIN_S="0")
    farm.start_worker("nochain", 1)
    with farm.client() as client:
        ids = client.submit_many([{"command": f"echo {i}"} for i in range(6)])
        results = collect_once(client, ids, 60, farm)
        assert all(r.status == Status.SUCCEEDED for r in results.values())
        assert chained(client) == 0

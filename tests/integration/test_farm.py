"""The farm end to end: real Redis, real `sandfarm worker` processes, real sandboxes."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import redis

from producer.client import FarmClient
from producer.protocol import TASK_NAME
from sandbox_core import JobResult, Status
from tests.conftest import job_shared_dir
from tests.farmkit import (  # noqa: F401
    SANDFARM,
    Farm,
    collect_once,
    farm_db,
    private_db,
    running_flower,
    wait_for,
)

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def farm(farm_db: str, tmp_path_factory, is_root: bool):  # noqa: F811
    """Two workers with distinct node names, two slots each."""
    from tests.conftest import require

    require(is_root, "the farm's sandbox slots need root (per-slot uids)")
    farm = Farm(farm_db, tmp_path_factory.mktemp("farm"))
    try:
        farm.start_worker("alpha", 2, wait=False)
        farm.start_worker("beta", 2, wait=False)
        for worker in farm.workers:
            worker.wait_ready()
        yield farm
    finally:
        farm.stop()


def mixed_jobs(tag: str) -> list[tuple[dict, Status, object]]:
    """(spec, expected status, check of the result) for each kind of job."""
    jobs: list[tuple[dict, Status, object]] = []
    for i in range(12):
        jobs.append(
            (
                {"id": f"{tag}-ok-{i}", "code": f"print({i} * 3)", "labels": {"kind": "ok"}},
                Status.SUCCEEDED,
                lambda r, i=i: r.steps[0].stdout == f"{i * 3}\n",
            )
        )
    # Text beyond ASCII in code, labels and output (the message is UTF-8 JSON, unescaped)
    text = "h\u00e9llo \u2713 \u65e5\u672c \U0001f600"
    jobs.append(
        (
            {"id": f"{tag}-utf8", "code": f"print({text!r})", "labels": {"w\u00f6rd": text}},
            Status.SUCCEEDED,
            lambda r: r.steps[0].stdout == text + "\n",
        )
    )
    for i in range(5):
        jobs.append(
            (
                {"id": f"{tag}-fail-{i}", "command": f"echo no >&2; exit {i + 1}"},
                Status.FAILED,
                lambda r, i=i: r.steps[0].exit_code == i + 1 and r.steps[0].stderr == "no\n",
            )
        )
    for i in range(3):
        jobs.append(
            (
                {"id": f"{tag}-slow-{i}", "command": "sleep 30", "limits": {"timeout_s": 1}},
                Status.TIMED_OUT,
                lambda r: r.timings.run_ms < 10_000,
            )
        )
    for i in range(2):
        flood = "import sys\nwhile True: sys.stdout.write('x' * 65536)"
        jobs.append(
            (
                {
                    "id": f"{tag}-flood-{i}",
                    "code": flood,
                    "limits": {"flood_kill_bytes": 4 << 20, "output_bytes": 4096},
                },
                Status.OUTPUT_FLOODED,
                lambda r: r.steps[0].stdout_bytes >= 4 << 20 and r.steps[0].truncated,
            )
        )
    for i in range(5):
        check = f"python3 -c 'from src.solution import f; assert f(2) == {i}'"
        steps = [
            {
                "kind": "write_file",
                "path": "src/solution.py",
                "content": "def f(x):\n    return x\n",
            },
            {"kind": "bash", "command": check},
            {
                "kind": "write_file",
                "path": "src/solution.py",
                "content": f"def f(x):\n    return {i}\n",
            },
            {"kind": "bash", "command": f"{check} && echo ok"},
            {"kind": "read_file", "path": "src/solution.py"},
        ]
        expected = Status.SUCCEEDED if i == 2 else Status.FAILED
        jobs.append(
            (
                {"id": f"{tag}-multi-{i}", "steps": steps, "labels": {"trajectory": str(i)}},
                expected,
                lambda r, i=i: (
                    len(r.steps) == 5
                    and r.steps[3].stdout == "ok\n"
                    and f"return {i}" in r.steps[4].stdout
                ),
            )
        )
    return jobs


def test_mixed_batch_exactly_one_correct_result_per_job(farm: Farm) -> None:
    tag = uuid.uuid4().hex[:6]
    jobs = mixed_jobs(tag)
    with farm.client() as client:
        ids = client.submit_many([spec for spec, _, _ in jobs])
        # A spec only the worker sees (sent raw, by task name): rejected there, field named.
        bad_id = f"{tag}-bad"
        qid = f"{client.tenant}/{bad_id}"
        client.redis.set(client.keys.job(qid), "{}", ex=60)
        meta = {"id": bad_id, "tenant": client.tenant, "notify": client.done_key}
        client.celery.send_task(
            TASK_NAME,
            args=[{"command": "true", "limits": {"timeout_s": 1e9}}, meta],
            task_id=qid,
            queue=client.settings.queue,
        )
        results = collect_once(client, [*ids, bad_id], 90, farm)
        for (spec, status, check), job_id in zip(jobs, ids, strict=True):
            result = results[job_id]
            assert result.status == status, (job_id, result.model_dump_json()[:2000])
            assert check(result), (job_id, result.model_dump_json()[:2000])
            assert result.attempts == 1
            assert result.worker in {w.name for w in farm.workers}
            assert result.labels == spec.get("labels", {})
        bad = results[bad_id]
        assert bad.status == Status.REJECTED
        assert "limits.timeout_s" in (bad.message or "")
        assert {r.worker for r in results.values()} == {w.name for w in farm.workers}
        # Exactly one stored result per job, no duplicates, nothing left in flight.
        stored = list(client.redis.scan_iter(client.keys.result("*"), count=1000))
        assert len(stored) == len(results)
        assert client.status()["duplicates"] == 0
        ttl = client.redis.ttl(client.keys.result(client.jobs.qid(ids[0])))
        assert 0 < ttl <= client.settings.result_ttl_s
        assert client.redis.ttl(client.keys.job(client.jobs.qid(ids[0]))) > 0


def test_same_id_twice_runs_once(farm: Farm) -> None:
    # A file the sandbox (a slot uid) may append to: each execution adds one line.
    shared = job_shared_dir("sandfarm-once-")
    shared.chmod(0o777)
    counter = shared / "runs"
    counter.touch()
    counter.chmod(0o666)
    job_id = f"once-{uuid.uuid4().hex[:8]}"
    spec = {"id": job_id, "command": f"set -e; echo run >> {counter}; sleep 0.3"}
    with farm.client() as first, farm.client() as second:
        assert first.submit(spec) == job_id
        assert second.submit(dict(spec)) == job_id  # another client, same id
        assert first.submit_many([spec, spec]) == [job_id, job_id]
        result = first.result(job_id, timeout=30)
        assert result is not None and result.status == Status.SUCCEEDED
        time.sleep(1.0)  # a second execution, if any, would have started by now
        assert counter.read_text() == "run\n"
        assert first.redis.get(first.keys.attempts(first.jobs.qid(job_id))) == b"1"
        assert first.redis.llen(first.settings.queue) == 0
    shutil.rmtree(shared)


def test_every_result_says_where_its_time_went(farm: Farm) -> None:
    """Phase timings: the farm's (dispatch, delivery, store) and the sandbox's (slot,
    setup, steps with spawn and run, collect, teardown), each measured, adding up."""
    spec = {
        "files": {"seed.txt": "x"},
        "steps": [
            {"kind": "bash", "command": "sleep 0.2; echo one > out.txt"},
            {"kind": "python", "code": "print(open('out.txt').read())"},
        ],
        "collect": ["out.txt"],
    }
    with farm.client() as client:
        job_id = client.submit(spec)
        result = client.result(job_id, timeout=60)
    assert result is not None and result.status == Status.SUCCEEDED, result
    phases = result.timings.phases
    measured = phases.model_dump()
    assert all(v is not None and v >= 0 for v in measured.values()), measured
    first, second = result.steps
    assert first.duration_ms >= 200 and first.spawn_ms > 0 and second.spawn_ms > 0
    assert phases.steps_ms >= first.spawn_ms + first.duration_ms + second.duration_ms
    sandbox = phases.setup_ms + phases.steps_ms + phases.collect_ms + phases.teardown_ms
    assert result.timings.run_ms is not None
    assert sandbox <= result.timings.run_ms + 1 and sandbox >= 0.9 * result.timings.run_ms
    assert phases.store_ms < 5000 and phases.delivery_ms < 30_000
    wait = result.timings.queue_wait_ms
    assert wait is not None and phases.dispatch_ms <= wait + 50  # one clock here


def test_cancel_queued_and_running(farm: Farm) -> None:
    with farm.client() as client:
        running_id = client.submit({"command": "sleep 20", "limits": {"timeout_s": 60}})
        wait_for(
            lambda: client.redis.exists(client.keys.running(client.jobs.qid(running_id))),
            20,
            what="start",
        )
        t0 = time.monotonic()
        assert client.cancel(running_id) is True
        result = client.result(running_id, timeout=15)
        assert result is not None and result.status == Status.CANCELLED
        assert time.monotonic() - t0 < 5
        assert client.cancel(running_id) is False  # already final
        assert client.cancel("no-such-job") is False

    # A queued job: the queue is paused by a farm with no worker on it.
    other = Farm(farm.redis_url, farm.tmp)
    with other.client() as client:
        queued = client.submit({"command": "echo never"})
        assert client.cancel(queued) is True
        result = next(client.as_completed([queued], timeout=5))
        assert result.status == Status.CANCELLED
        # still waiting in its tenant's queue (nothing is dispatched with no worker)
        pending = client.keys.pending(client.tenant)
        assert client.redis.llen(pending) == 1
        assert client.redis.llen(client.settings.queue) == 0
        worker = other.start_worker("late", 1)
        try:
            wait_for(lambda: client.redis.llen(pending) == 0, 20, what="drain")
            assert client.redis.llen(client.settings.queue) == 0  # dropped, never sent
            wait_for(lambda: client.status()["in_flight"] == 0, 10, what="idle")
            again = client.result(queued)
            assert again is not None and again.status == Status.CANCELLED
            assert not again.steps  # it never ran
        finally:
            worker.stop()


def test_as_completed_5000_jobs_in_few_redis_calls(farm_db: str) -> None:  # noqa: F811
    """The collection path: 5,000 stored results, announced on the completion list,
    collected in O(N / batch) calls (counted on the client's execute_command)."""
    farm = Farm(farm_db, Path("/tmp"))
    n, batch = 5000, 1000
    with farm.client() as client:
        ids = [f"fake-{i}" for i in range(n)]
        pipe = client.redis.pipeline(transaction=False)
        for job_id in ids:
            payload = JobResult(id=job_id, status=Status.SUCCEEDED).model_dump_json()
            pipe.set(client.keys.result(client.jobs.qid(job_id)), payload, ex=300)
        pipe.execute()
        # Half are already stored before collection starts; half announced on the list.
        calls: list[str] = []
        real = client.redis.execute_command

        def counting(*args, **kwargs):
            calls.append(str(args[0]))
            return real(*args, **kwargs)

        # Results that exist but are announced only later: delete half, announce them.
        late = ids[n // 2 :]
        saved = client.redis.mget([client.keys.result(client.jobs.qid(i)) for i in late])
        client.redis.delete(*(client.keys.result(client.jobs.qid(i)) for i in late))
        client.redis.execute_command = counting  # type: ignore[method-assign]
        collected = []
        it = client.as_completed(ids, timeout=30, batch=batch)
        for _ in range(n // 2):
            collected.append(next(it))
        before = len(calls)
        pipe = client.redis.pipeline(transaction=False)
        for job_id, raw in zip(late, saved, strict=True):
            pipe.set(client.keys.result(client.jobs.qid(job_id)), raw, ex=300)
        pipe.rpush(client.done_key, *late)
        pipe.execute()
        collected.extend(it)
        client.redis.execute_command = real  # type: ignore[method-assign]
        assert sorted(r.id for r in collected) == sorted(ids)
        # First half: 3 MGETs of 1000 (of the 5000 pending); second half: per 1000 ids one
        # BLMPOP and one MGET. Allow a few idle BLMPOPs; one call per job would be 5000.
        assert before <= n // batch + 1
        assert len(calls) <= 2 * (n // batch) + 4, calls
        assert "MGET" in calls and "BLMPOP" in calls
        client.redis.delete(*(client.keys.result(client.jobs.qid(i)) for i in ids))


def test_status_counts_workers_and_queue(farm: Farm) -> None:
    with farm.client() as client:
        info = client.status()
        names = {w["name"] for w in info["workers"]}
        assert names == {w.name for w in farm.workers}
        assert info["workers_online"] == 2
        assert info["queued"] == 0
        out = subprocess.run(
            [SANDFARM, "status", "--redis-url", farm.redis_url],
            capture_output=True,
            text=True,
            env={**os.environ, **farm.env},
            timeout=30,
        )
        assert out.returncode == 0, out.stderr
        assert "workers online: 2" in out.stdout


def test_cli_submit_wait(farm: Farm) -> None:
    env = {**os.environ, **farm.env}

    def submit(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [SANDFARM, "submit", *args], capture_output=True, text=True, env=env, timeout=60
        )

    out = submit("--code", "print('from the farm')", "--wait", "--json")
    assert out.returncode == 0, out.stderr
    result = JobResult.model_validate_json(out.stdout)
    assert result.status == Status.SUCCEEDED
    assert result.steps[0].stdout == "from the farm\n"
    out = submit("--command", "true", "--json")
    assert out.returncode == 0, out.stderr
    assert '"id"' in out.stdout
    out = submit("--command", "true", "--id", "no spaces allowed")
    assert out.returncode == 2 and "id:" in out.stderr, out.stderr


def test_flower_lists_workers_and_tasks_with_summary(farm: Farm) -> None:
    requests = pytest.importorskip("requests")
    with running_flower(farm) as base:
        secret = "print('TOP-SECRET-CODE')"
        with farm.client() as client:
            ids = client.submit_many(
                [{"code": secret, "labels": {"team": "eval"}} for _ in range(3)]
            )
            results = list(client.as_completed(ids, timeout=60))
        assert all(r.status == Status.SUCCEEDED for r in results)

        def workers() -> dict | None:
            data = requests.get(f"{base}/api/workers?refresh=1", timeout=10).json()
            return data if {w.name for w in farm.workers} <= set(data) else None

        wait_for(workers, 30, 0.5, "flower lists both workers")

        def tasks() -> dict | None:
            data = requests.get(f"{base}/api/tasks", timeout=10).json()
            qids = {f"{client.tenant}/{i}": i for i in ids}
            mine = {
                qids[k]: v for k, v in data.items() if k in qids and v.get("state") == "SUCCESS"
            }
            return mine if len(mine) == len(ids) else None

        listed = wait_for(tasks, 30, 0.5, "flower lists the finished tasks")
        for job_id, task in listed.items():
            assert task["name"] == TASK_NAME
            assert f"job={job_id}" in task["args"]
            assert "steps=[python]" in task["args"] and "team=eval" in task["args"]
            assert "TOP-SECRET" not in str(task)


def test_private_db_is_isolated(redis_url: str) -> None:
    with private_db(redis_url) as one, private_db(redis_url) as two:
        assert one != two
        redis.Redis.from_url(one).set("k", "1")
        assert redis.Redis.from_url(two).get("k") is None


def test_submit_many_validates_before_sending(farm_db: str) -> None:  # noqa: F811
    from sandbox_core import SpecError

    farm = Farm(farm_db, Path("/tmp"))
    with farm.client() as client:
        with pytest.raises(SpecError) as info:
            client.submit_many([{"command": "true"}, {"command": "x", "limits": {"cpu_s": 0}}])
        assert info.value.field == "limits.cpu_s"
        assert client.redis.llen(client.settings.queue) == 0


def test_client_is_producer_only() -> None:
    """The producer enqueues by name and never imports worker code."""
    code = (
        "import sys, producer.client, producer.cli, producer.commands.farm;"
        "bad = [m for m in sys.modules if m == 'worker' or m.startswith('worker.')];"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    out = subprocess.run(
        [str(Path(SANDFARM).parent / "python"), "-c", code], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert FarmClient  # imported above without worker modules too

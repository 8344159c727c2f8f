"""What a new user hits, tried as one would: a reused id, a wait with no worker, a worker
asked for another backend, bad Redis URLs, trajectory verdicts, no Docker engine.
Real Redis, real `sandfarm worker` processes, the real CLI."""

from __future__ import annotations

import os
import subprocess
import time
import uuid

import pytest

from producer.protocol import IdConflictError
from sandbox_core import Status
from tests.farmkit import (  # noqa: F401
    SANDFARM,
    Farm,
    farm_db,
    free_port,
    make_farm,
    module_farm,
    wait_for,
)

pytestmark = pytest.mark.timeout(180)


farm = module_farm("nu")


def cli(farm: Farm, *args: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [SANDFARM, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **farm.env, **env},
    )


def test_a_reused_id_never_returns_a_stale_verdict(farm: Farm) -> None:
    job_id = f"he-000-add-{uuid.uuid4().hex[:6]}"
    with farm.client() as client:
        client.submit({"id": job_id, "code": "print('first')"})
        first = client.result(job_id, timeout=30)
        assert first is not None and first.status == Status.SUCCEEDED
        # The same id and spec: idempotent, the same job (it does not run again).
        assert client.submit({"id": job_id, "code": "print('first')"}) == job_id
        assert client.redis.get(client.keys.attempts(client.jobs.qid(job_id))) == b"1"
        # The same id for another spec: refused, through the SDK...
        with pytest.raises(IdConflictError) as info:
            client.submit({"id": job_id, "code": "raise SystemExit(1)"})
        assert info.value.conflicts == [job_id] and info.value.submitted == []
        # ...and in a mixed call the others still go.
        fresh = [f"{job_id}-a", f"{job_id}-b"]
        with pytest.raises(IdConflictError) as info:
            client.submit_many(
                [
                    {"id": fresh[0], "command": "echo a"},
                    {"id": job_id, "command": "exit 1"},
                    {"id": fresh[1], "command": "echo b"},
                ]
            )
        assert info.value.submitted == fresh
        results = {r.id: r for r in client.as_completed(fresh, timeout=30)}
        assert {r.steps[0].stdout for r in results.values()} == {"a\n", "b\n"}
    # ...and through the CLI: exit 2, naming the id, never the old verdict.
    out = cli(farm, "submit", "--id", job_id, "--code", "raise SystemExit(1)", "--wait")
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert job_id in out.stderr and "succeeded" not in out.stderr + out.stdout


def test_a_trajectory_verdict_and_message(farm: Farm) -> None:
    test = "from solution import add\ndef test_add():\n    assert add(2, 3) == 5\n"
    steps = [
        {"kind": "write_file", "path": "solution.py", "content": "def add(a, b):\n    return a\n"},
        {"kind": "write_file", "path": "test_solution.py", "content": test},
        {"kind": "bash", "command": "python3 -m pytest -q", "check": False},
        {
            "kind": "write_file",
            "path": "solution.py",
            "content": "def add(a, b):\n    return a + b\n",
        },
        {"kind": "bash", "command": "python3 -m pytest -q"},
        {"kind": "read_file", "path": "solution.py"},
    ]
    with farm.client() as client:
        ok = client.submit({"steps": steps})
        strict = client.submit({"steps": [{**s, "check": True} for s in steps]})
        results = {r.id: r for r in client.as_completed([ok, strict], timeout=60)}
    replay = results[ok]
    assert replay.status == Status.SUCCEEDED, replay
    assert replay.steps[2].status == "failed" and replay.steps[2].check is False  # recorded
    assert replay.message is None
    checked = results[strict]
    assert checked.status == Status.FAILED
    assert checked.message == "step 2 (bash) exited 1"


def test_one_worker_serves_several_backends(make_farm) -> None:  # noqa: F811
    farm: Farm = make_farm(SANDFARM_BACKENDS="process,bwrap")
    farm.start_worker("mixed", 1)
    with farm.client() as client:
        started = time.monotonic()
        local = client.submit({"backend": "bwrap", "code": "print('in bwrap')"})
        also = client.submit({"backend": "process", "code": "print('in process')"})
        other = client.submit({"backend": "docker", "code": "print('never')"})
        results = {r.id: r for r in client.as_completed([local, also, other], timeout=60)}
        assert time.monotonic() - started < 20  # no 30 s wait for its own slot
        (beat,) = client.status()["workers"]  # `sandfarm status` shows what it serves
        assert beat["queues"] == [farm.env["SANDFARM_QUEUE"]]
        assert beat["backends"] == ["process", "bwrap"] and beat["concurrency"] == 1
    assert results[local].status == Status.SUCCEEDED, results[local]
    assert results[local].backend == "bwrap"
    assert results[also].status == Status.SUCCEEDED
    rejected = results[other]
    assert rejected.status == Status.REJECTED and rejected.steps == []
    assert "not served" in (rejected.message or "") and "process, bwrap" in rejected.message


def test_a_wait_with_no_worker_is_never_silent(make_farm) -> None:  # noqa: F811
    farm: Farm = make_farm()  # nothing consumes its queue
    started = time.monotonic()
    proc = subprocess.Popen(
        [SANDFARM, "submit", "--code", "print(1)", "--wait"],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env={**os.environ, **farm.env},
    )
    try:
        line = proc.stderr.readline() if proc.stderr else ""
        assert time.monotonic() - started < 20, line  # well before the next notice (30 s)
        assert f"no worker consumes queue {farm.env['SANDFARM_QUEUE']}" in line
        assert "still waiting" in line and proc.poll() is None  # and it keeps waiting
    finally:
        proc.kill()
        proc.wait(10)
    out = cli(farm, "submit", "--code", "print(1)", "--wait", "--wait-timeout", "2")
    assert out.returncode == 1
    assert farm.env["SANDFARM_QUEUE"] in out.stderr and "no worker consumes it" in out.stderr


@pytest.mark.parametrize(
    "url",
    ["127.0.0.1:6401", "http://127.0.0.1:6379", "redis://127.0.0.1:{port}/0"],
    ids=["no-scheme", "http", "wrong-port"],
)
def test_bad_redis_urls_fail_in_seconds_in_one_line(tmp_path, url: str) -> None:
    url = url.format(port=free_port())
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text('{"command": "true"}\n')
    for args in (
        ["status"],
        ["submit", "--code", "print(1)"],
        ["result", "some-id"],
        ["cancel", "some-id"],
        ["batch", "run", str(jobs), "-o", str(tmp_path / "out.jsonl")],
        ["worker", "-c", "1"],
    ):
        started = time.monotonic()
        out = subprocess.run(
            [SANDFARM, *args, "--redis-url", url], capture_output=True, text=True, timeout=30
        )
        took = time.monotonic() - started
        assert out.returncode == 1, (args, out.stderr)
        assert took < 15, (
            args,
            took,
        )  # the retrying client took ~75 s; start-up under load, seconds
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in out.stderr, (args, out.stderr)
        assert url in lines[0], (args, lines)


def test_docker_without_an_engine_says_so_and_exits_1() -> None:
    env = {**os.environ, "DOCKER_HOST": "unix:///nonexistent"}
    out = subprocess.run(
        [SANDFARM, "run", "--backend", "docker", "--code", "print(1)"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert out.returncode == 1, out
    assert "no Docker engine at unix:///nonexistent" in out.stderr
    assert "ops/install_docker.sh" in out.stderr and "Traceback" not in out.stderr
    doctor = subprocess.run(
        [SANDFARM, "doctor"], capture_output=True, text=True, env=env, timeout=60
    ).stdout
    assert doctor.count("no Docker engine") == 1, doctor

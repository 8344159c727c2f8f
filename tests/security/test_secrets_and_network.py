"""The job cannot see the worker's secrets or reach the broker."""

from __future__ import annotations

import os

from sandbox_core import Status
from tests.conftest import redis_reachable, require

SECRET = "sandfarm-secret-7f3a9c"


def test_worker_environment_is_invisible(run, monkeypatch):
    monkeypatch.setenv("SANDFARM_TEST_SECRET", SECRET)
    worker_pid = os.getpid()
    result = run(
        command=(
            "env; cat /proc/$PPID/environ; "
            f"cat /proc/{worker_pid}/environ; cat /proc/1/environ; "
            "for f in /proc/*/environ; do cat $f; done 2>/dev/null; true"
        )
    )
    step = result.steps[0]
    assert SECRET not in step.stdout and SECRET not in step.stderr
    assert "SANDFARM_TEST_SECRET" not in step.stdout


def test_job_env_is_clean_but_has_its_own(run, monkeypatch):
    monkeypatch.setenv("SANDFARM_TEST_SECRET", SECRET)
    result = run(command="env", env={"MY_VAR": "mine"})
    lines = set(result.steps[0].stdout.splitlines())
    assert "MY_VAR=mine" in lines
    assert not any(line.startswith("SANDFARM_") for line in lines)


def test_job_cannot_reach_the_broker(run):
    require(redis_reachable(), "no Redis on 127.0.0.1:6379 to attack")
    code = (
        "import socket\n"
        "try:\n"
        "    socket.create_connection(('127.0.0.1', 6379), timeout=2)\n"
        "    print('CONNECTED')\n"
        "except OSError as exc:\n"
        "    print('refused', exc)\n"
    )
    result = run(code=code)
    assert result.status == Status.SUCCEEDED, result
    assert "CONNECTED" not in result.steps[0].stdout
    assert "refused" in result.steps[0].stdout


def test_network_flag_allows_loopback_inside_job(run):
    code = (
        "import socket\n"
        "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
        "c = socket.create_connection(s.getsockname()); print('loopback ok')\n"
    )
    result = run(code=code)
    assert result.steps[0].stdout == "loopback ok\n", result

"""Nothing a job starts outlives it: orphans, setsid escapers, daemons, fork bombs."""

from __future__ import annotations

import threading
import time

from sandbox_core import Status
from tests.security.helpers import new_marker, pids_with_marker, self_alive, wait_gone

SLEEPER = "python3 -c 'import time; time.sleep(300)' {marker}"


def test_orphaned_grandchild_is_killed(run):
    marker = new_marker()
    result = run(command=f"( {SLEEPER.format(marker=marker)} & ) ; echo started")
    assert result.status == Status.SUCCEEDED, result
    assert "started" in result.steps[0].stdout
    assert wait_gone(marker, timeout_s=0.5) == []


def test_setsid_grandchild_is_killed(run):
    marker = new_marker()
    result = run(command=f"setsid {SLEEPER.format(marker=marker)} > /dev/null 2>&1 & sleep 0.3")
    assert result.status == Status.SUCCEEDED, result
    assert wait_gone(marker, timeout_s=0.5) == []


def test_double_forked_daemon_is_killed(run):
    marker = new_marker()
    code = f"""
import os, sys, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.closerange(0, 3)
        os.execvp("python3", ["python3", "-c", "import time; time.sleep(300)", "{marker}"])
    os._exit(0)
time.sleep(0.3)
print("parent done")
"""
    result = run(code=code)
    assert result.status == Status.SUCCEEDED, result
    assert wait_gone(marker, timeout_s=0.5) == []


def test_job_closing_its_streams_is_killed_at_timeout(run):
    marker = new_marker()
    started = time.monotonic()
    result = run(
        command=f"exec >&- 2>&- <&-; exec {SLEEPER.format(marker=marker)}",
        limits={"timeout_s": 2},
    )
    assert result.status == Status.TIMED_OUT, result
    assert time.monotonic() - started < 10
    assert wait_gone(marker) == []


def test_fork_bomb_is_contained_and_next_job_runs(run):
    marker = new_marker()
    bomb = (
        "import os, time\n"
        "while True:\n"
        "    try:\n"
        "        os.fork()\n"
        "    except OSError:\n"
        "        time.sleep(0.01)\n"
    )
    result = run(
        steps=[{"kind": "bash", "command": f"exec python3 -c '{bomb}' {marker}"}],
        limits={"timeout_s": 3, "processes": 32},
    )
    assert result.status != Status.SUCCEEDED, result
    assert wait_gone(marker) == []
    after = run(command="echo fine")
    assert after.status == Status.SUCCEEDED, after
    assert after.steps[0].stdout == "fine\n"


def test_shell_fork_bomb_is_contained(run):
    marker = new_marker()  # bash's $0: every fork of the bomb carries it in its cmdline
    result = run(
        command=f"bash -c ':(){{ :|:& }};:; sleep 2' {marker}",
        limits={"timeout_s": 4, "processes": 32},
    )
    assert result.status.is_final
    assert wait_gone(marker) == []
    assert run(command="echo fine").status == Status.SUCCEEDED


def test_kill_minus_one_spares_the_host_and_other_jobs(run):
    marker = new_marker()
    other: dict = {}

    def long_job() -> None:
        other["result"] = run(command=f"{SLEEPER.format(marker=marker)} & sleep 2; echo A-alive")

    thread = threading.Thread(target=long_job)
    thread.start()
    deadline = time.monotonic() + 10
    while not pids_with_marker(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pids_with_marker(marker), "the other job never started"
    attacker = run(command="kill -9 -1; sleep 0.5; echo still-here")
    thread.join(timeout=30)
    assert self_alive()
    assert other["result"].status == Status.SUCCEEDED, other["result"]
    assert "A-alive" in other["result"].steps[0].stdout
    assert attacker.status.is_final  # kill(-1) spares its caller; only its own uid was hit
    assert wait_gone(marker) == []

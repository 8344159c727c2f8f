"""Nothing a job starts outlives it: orphans, setsid escapers, daemons, fork bombs.

Each escaper is first seen alive on the host while its job runs (and tells the job it
started), so "gone afterwards" means killed, not never started."""

from __future__ import annotations

import subprocess
import threading
import time

from sandbox_core import Status, parse_spec
from tests.security.conftest import make_backend
from tests.security.helpers import (
    NOBODY,
    backend_kind,
    host_processes_of,
    new_marker,
    pids_with_marker,
    run_watching,
    self_alive,
    shell_split,
    wait_gone,
    wait_until,
)

# A sleeper that says it started: it writes its pid to `started` in the job's workspace
SLEEPER = (
    'python3 -c \'import os, sys, time; open(sys.argv[1], "w").write(str(os.getpid()));'
    " time.sleep(300)' started {marker}"
)
# The job waits until its escaper is up, shows the pid, and gives the host time to see it
AWAIT_STARTED = (
    "for i in $(seq 200); do [ -s started ] && break; sleep 0.02; done; "
    'kill -0 "$(cat started)" && echo "ESCAPER-ALIVE $(cat started)"; sleep 0.3'
)


def _sleeper(marker: str) -> str:
    return SLEEPER.format(marker=shell_split(marker))


def _check_escaper(result, watched, marker: str) -> None:
    assert result.status == Status.SUCCEEDED, result
    assert "ESCAPER-ALIVE" in result.steps[0].stdout, result  # it started, in the job
    assert watched.pids, "the escaper was never alive on the host: nothing was killed"
    assert wait_gone(marker, timeout_s=0.5) == []


def test_orphaned_grandchild_is_killed(run):
    marker = new_marker()
    result, watched = run_watching(
        lambda: run(command=f"( {_sleeper(marker)} & ) ; {AWAIT_STARTED}"), marker
    )
    _check_escaper(result, watched, marker)


def test_setsid_grandchild_is_killed(run):
    marker = new_marker()
    command = f"setsid {_sleeper(marker)} > /dev/null 2>&1 & {AWAIT_STARTED}"
    result, watched = run_watching(lambda: run(command=command), marker)
    _check_escaper(result, watched, marker)


def test_double_forked_daemon_is_killed(run):
    marker = new_marker()
    code = f"""
import os, sys, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.closerange(0, 3)
        os.execvp("python3", ["python3", "-c",
            "import os, time; open('started', 'w').write(str(os.getpid())); time.sleep(300)",
            "{marker[:8]}" + "{marker[8:]}"])  # only the daemon's cmdline has it whole
    os._exit(0)
for _ in range(200):
    if os.path.exists("started") and open("started").read():
        break
    time.sleep(0.02)
pid = int(open("started").read())
os.kill(pid, 0)
print("ESCAPER-ALIVE", pid)
time.sleep(0.3)
"""
    result, watched = run_watching(lambda: run(code=code), marker)
    _check_escaper(result, watched, marker)


def test_job_closing_its_streams_is_killed_at_timeout(run):
    marker = new_marker()
    started = time.monotonic()
    result, watched = run_watching(
        lambda: run(
            command=f"exec >&- 2>&- <&-; exec {_sleeper(marker)}",
            limits={"timeout_s": 2},
        ),
        marker,
    )
    assert watched.pids, "the job never ran its sleeper"
    assert result.status == Status.TIMED_OUT, result
    assert time.monotonic() - started < 10
    assert wait_gone(marker) == []


CAP = 32
# Processes of the slot uid a backend keeps beside the job's own, on top of its cap
# (bwrap: itself and the init, as test_bwrap_isolation documents)
BESIDE_THE_JOB = {"process": 0, "bwrap": 2, "docker": 0}


def _bomb(run, backend, request, command: str, timeout_s: float):
    """Run a fork bomb; its processes counted from the host (those of its uid, zombies
    included, as RLIMIT_NPROC counts them) must reach the cap and never pass it."""
    kind = backend_kind(backend)
    marker = new_marker()
    result, watched = run_watching(
        lambda: run(
            command=command.format(marker=marker),
            limits={"timeout_s": timeout_s, "processes": CAP},
        ),
        marker,
        count_uid=True,
    )
    assert watched.pids, "the bomb never ran"
    peak, allowed = watched.peak_of_uid, CAP + BESIDE_THE_JOB[kind]
    assert peak >= CAP - 2, f"the bomb peaked at {peak} processes, below its cap of {CAP}"
    assert peak <= allowed, f"{peak} processes of the slot uid ran under a cap of {CAP}"
    assert wait_gone(marker) == []
    return result


PYTHON_BOMB = (
    "import os, time\n"
    "while True:\n"
    "    try:\n"
    "        os.fork()\n"
    "    except OSError:\n"
    "        time.sleep(0.01)\n"
)


def test_fork_bomb_is_contained_and_next_job_runs(backend, run, request):
    command = f"exec python3 -c '{PYTHON_BOMB}' {{marker}}"
    result = _bomb(run, backend, request, command, timeout_s=3)
    assert result.status == Status.TIMED_OUT, result  # the bomb never ended on its own
    after = run(command="echo fine")
    assert after.status == Status.SUCCEEDED, after
    assert after.steps[0].stdout == "fine\n"


def test_shell_fork_bomb_is_contained(backend, run, request):
    # the marker is bash's $0: every fork of the bomb carries it in its cmdline
    result = _bomb(run, backend, request, "bash -c ':(){{ :|:& }};:; sleep 2' {marker}", 4)
    assert result.status.is_final and result.steps, result
    assert run(command="echo fine").status == Status.SUCCEEDED


def test_kill_minus_one_spares_the_host_and_other_jobs(run):
    marker = new_marker()
    other: dict = {}

    def long_job() -> None:
        sleeper = f"python3 -c 'import time; time.sleep(300)' {shell_split(marker)}"
        other["result"] = run(command=f"{sleeper} & sleep 2; echo A-alive")

    thread = threading.Thread(target=long_job)
    thread.start()
    victims = wait_until(lambda: pids_with_marker(marker), thread, timeout_s=10)
    assert victims, "the other job never started"
    # kill(-1) reaches everything the attacker may signal: its own sleeper dies with it
    attacker = run(
        command="sleep 30 & own=$!; kill -9 -1; sleep 0.5; "
        "kill -0 $own 2>/dev/null || echo OWN-VICTIM-KILLED; echo still-here"
    )
    assert set(victims) <= set(pids_with_marker(marker))  # the other job's process survived
    thread.join(timeout=30)
    assert self_alive()
    assert attacker.steps and "OWN-VICTIM-KILLED" in attacker.steps[0].stdout, attacker
    assert "still-here" in attacker.steps[0].stdout  # kill(-1) spares its caller
    assert other["result"].status == Status.SUCCEEDED, other["result"]
    assert "A-alive" in other["result"].steps[0].stdout
    assert wait_gone(marker) == []


def test_orphans_leave_no_zombie_behind(backend):
    """A job's orphans, reparented to the worker, are reaped: none is left as a zombie of
    the slot uid (each would count against the slot's process cap, job after job), also
    while a zombie child of another uid is first in the worker's line (bwrap leaves one,
    uid 65534, in every worker that ran a bwrap job)."""
    kind = backend_kind(backend)
    # the plant: a zombie child of the worker of another uid, as a bwrap job leaves one
    other = subprocess.Popen(["/bin/true"], user=NOBODY, group=NOBODY)
    deadline = time.monotonic() + 5
    while not any(f"{other.pid} " in p and "zombie" in p for p in host_processes_of(NOBODY)):
        assert time.monotonic() < deadline, "the plant never became a zombie"
        time.sleep(0.01)
    sandbox = make_backend(kind, slot=240)  # one slot, so the next job is of the same uid
    try:
        marker = new_marker()
        orphans = (
            f"for i in $(seq 10); do (exec -a {shell_split(marker)} sleep 0.3 &); done; sleep 0.6"
        )
        first, watched = run_watching(
            lambda: sandbox.run(parse_spec({"command": orphans, "limits": {"processes": 16}})),
            marker,
        )
        assert first.status == Status.SUCCEEDED, first
        assert len(watched.pids) >= 5 and len(watched.uids) == 1, watched  # they ran
        (uid,) = watched.uids
        zombies = [p for p in host_processes_of(uid) if "zombie" in p]
        after = sandbox.run(
            parse_spec(
                {
                    "command": "for i in $(seq 12); do sleep 0.2 & done; wait; echo forked-12",
                    "limits": {"processes": 16},
                }
            )
        )
    finally:
        sandbox.close()
        other.wait()
    assert zombies == [], f"{len(zombies)} zombies of the slot uid left: {zombies}"
    assert after.steps and after.steps[0].stdout == "forked-12\n", after

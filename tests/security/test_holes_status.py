"""A job cannot choose its own status: statuses come from what the kernel says (the real
wait status, the CPU time used, the memory cgroup's OOM kills), never from an exit code,
a signal it sent itself or an error message it printed.

Each fake is paired with the real thing, which must still read right (the control).
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from sandbox_core import Status, procevents


def _one(result):
    assert result.steps, result
    return result.steps[0]


def test_exit_152_is_a_failure_not_a_cpu_timeout(run):
    step = _one(run(command="exit 152"))
    assert (step.status, step.exit_code, step.signal) == ("failed", 152, None), step


def test_exit_137_is_a_failure_not_a_kill(run):
    step = _one(run(command="exit 137"))
    assert (step.status, step.exit_code, step.signal) == ("failed", 137, None), step
    # Control: a real SIGKILL still reads as one.
    killed = _one(run(command="kill -9 $$"))
    assert (killed.status, killed.signal) == ("crashed", 9), killed


def test_a_self_sent_sigxcpu_is_not_the_cpu_limit(run):
    step = _one(run(command="kill -XCPU $$", limits={"cpu_s": 5}))
    assert step.status == "crashed" and step.signal == 24, step
    # Control: spending the CPU limit is a timeout.
    spent = run(code="while True: pass", limits={"cpu_s": 1, "timeout_s": 20})
    assert spent.status == Status.TIMED_OUT and "CPU" in (spent.steps[0].message or ""), spent


def test_printing_memory_error_is_not_memory_exceeded(run):
    fake = run(code="import sys\nprint('MemoryError: out of memory', file=sys.stderr)\nsys.exit(1)")
    step = _one(fake)
    assert "MemoryError" in step.stderr, step  # it did print the lie
    assert fake.status == Status.FAILED, fake
    # Control: really exceeding the memory limit is memory_exceeded.
    real = run(
        code="x = bytearray(400 << 20)\nx[::4096] = b'y' * len(x[::4096])\nprint('ALLOC')",
        limits={"memory_mb": 128},
    )
    assert real.status == Status.MEMORY_EXCEEDED, real
    assert "ALLOC" not in real.steps[0].stdout


def test_another_processs_exit_under_the_execs_pid_is_not_its_status():
    """Docker: the kernel's word on an exec's end is the exit the proc connector heard for
    its host pid. A pid is reused, and a job forking fast cycles the host's pid space in
    seconds: another container's process given the pid after the exec's exit overwrote
    its entry (an attack review). Here the watcher is made to answer with such a
    process's `exit 0` for a step that ran `exit 137` (the watcher is asked only for
    129-255, the codes that can be a signal): it must not read succeeded (the engine's
    own code disagrees, so the kernel's entry is not the exec's). A step's `exit 1`
    never asks it."""
    from tests.conftest import require
    from tests.security.conftest import docker_status, make_backend

    require(*docker_status())
    sandbox = make_backend("docker", warm_pool=0)
    asked: list[int] = []
    real = sandbox.exits.status

    def overwritten(pid: int, since_ns: int, wait_s: float = 0.5) -> int | None:
        real(pid, since_ns, wait_s)  # the exec's own exit, heard ...
        asked.append(pid)
        return 0  # ... and replaced by another process's exit 0 under the same pid

    sandbox.exits.status = overwritten
    try:
        from sandbox_core import parse_spec

        plain = sandbox.run(parse_spec({"command": "exit 1"}))
        assert not asked, asked  # 1-128 cannot be a signal: nothing to ask
        result = sandbox.run(parse_spec({"command": "exit 137"}))
    finally:
        sandbox.close()
    assert (_one(plain).status, _one(plain).exit_code) == ("failed", 1), plain
    assert asked, "the watcher was never asked: the attack did not run"
    step = _one(result)
    assert step.status != "succeeded" and (step.exit_code, step.signal) != (0, None), step


@pytest.mark.no_backend
def test_the_exit_watcher_hears_no_fork_churn():
    """Docker: each worker process's exit watcher heard every fork and exit on the host,
    parsed in Python on no job's account; a job forking ~30,000 times a second made the
    docker workers' watchers drop events, and other tenants' `exit 137` read as SIGKILL
    (an attack review). It now asks the kernel for nonzero exits only."""
    from tests.conftest import require

    require(os.geteuid() == 0, "needs root: the proc connector needs CAP_NET_ADMIN")
    if not procevents.filters_events():
        pytest.skip(f"no connector event filter before Linux 6.6 ({os.uname().release})")
    everything = procevents.ExitWatcher(nonzero_only=False)  # the control
    watcher = procevents.ExitWatcher()
    try:
        since = time.monotonic_ns()
        for _ in range(2000):  # the churn: a fork and a zero exit each
            pid = os.fork()
            if pid == 0:  # pragma: no cover - the child
                os._exit(0)
            os.waitpid(pid, 0)
        failed, killed = os.fork(), os.fork()
        if failed == 0 or killed == 0:  # pragma: no cover - the children
            if failed == 0:
                os._exit(3)
            time.sleep(60)
        os.kill(killed, signal.SIGKILL)
        os.waitpid(failed, 0)
        os.waitpid(killed, 0)
        assert watcher.status(failed, since, wait_s=5) == 3 << 8  # what it is there for
        assert watcher.status(killed, since, wait_s=5) == signal.SIGKILL
        assert everything.heard() >= 2000  # the churn reached a watcher that heard all
        assert watcher.heard() < 200, watcher.heard()  # the host's own nonzero exits
    finally:
        everything.close()
        watcher.close()


def test_a_job_stopped_by_the_farm_is_charged_the_cpu_it_burnt(run):
    """Docker read a step's CPU time from the container's cgroup after killing it for its
    timeout or its flood: the cgroup was gone with it, so the job was charged 0 ms, and a
    tenant whose jobs all ended so never spent its daily CPU budget (an attack review)."""
    burnt = run(code="while True: pass", limits={"timeout_s": 2})
    assert burnt.status == Status.TIMED_OUT, burnt  # it burnt until the farm stopped it
    assert burnt.steps[0].cpu_ms >= 1000, burnt.steps[0]
    assert burnt.resources.cpu_ms >= 1000, burnt.resources
    flood = "import sys, time\nt = time.time()\nwhile time.time() - t < 1.2: pass\n"
    flood += "while True: sys.stdout.write('x' * 65536)\n"
    flooded = run(code=flood, limits={"timeout_s": 20})
    assert flooded.status == Status.OUTPUT_FLOODED, flooded
    assert flooded.resources.cpu_ms >= 1000, flooded.resources

"""A job's verdict is the one its program earns, on every backend: findings of an attack
review of the per-job fast paths (the python step's bootstrap, the exec helper, the
prewarmed sandbox). Each attack is a job whose honest run would read differently: a
failing test suite that read `succeeded`, output lost, a signal the worker ignores
inherited, a job that never ran read `succeeded`, another job's teardown made ours."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from sandbox_core import JobResult, Status, StepStatus, get_backend, parse_spec
from sandbox_core.backends.config import backend_config
from sandbox_core.backends.local import LocalBackend
from sandbox_core.defaults import MAX_SEED_BYTES, MAX_SEED_FILES
from tests.conftest import require

FAILING_SUITE = """
import unittest

class T(unittest.TestCase):
    def test_right(self):
        self.assertEqual(1, 1)

    def test_wrong(self):
        self.assertEqual(1, 2)

unittest.main()
"""
PASSING_SUITE = FAILING_SUITE.replace("self.assertEqual(1, 2)", "self.assertEqual(2, 2)")
FAILING_DOCTEST = '''
def add(a, b):
    """
    >>> add(1, 1)
    3
    """
    return a + b

import doctest, sys
sys.exit(1 if doctest.testmod().failed else 0)
'''
# What only works in the real __main__: pickling its classes, a pool's workers calling
# its functions; and the names the job finds in it (none of a bootstrap's).
MAIN_MODULE = """
names = sorted(k for k in globals() if not k.startswith("__") or k == "__warningregistry__")
import pickle, sys
from multiprocessing import get_context

class Point:
    pass

def square(x):
    return x * x

if __name__ == "__main__":
    print(type(pickle.loads(pickle.dumps(Point()))).__name__)
    with get_context("fork").Pool(2) as pool:
        print(pool.map(square, [1, 2, 3]))
    print(sys.modules["__main__"].square is square)
    print(names)
"""
# Padding past the longest source a backend passes on the command line (docker: 64 KiB),
# so the step's script file is run: both bootstraps are tested.
PAD = "\n#" + "x" * (70 * 1024) + "\n"


@pytest.fixture(params=["inline", "file"])
def pad(request: pytest.FixtureRequest) -> str:
    return "" if request.param == "inline" else PAD


def only_step(result: JobResult) -> tuple[str, str]:
    assert len(result.steps) == 1, result
    return result.steps[0].stdout, result.steps[0].stderr


def test_a_failing_unittest_suite_fails_its_job(run, pad: str) -> None:
    # the control: the same suite with its wrong test made right passes, and ran both
    passing = run(code=PASSING_SUITE + pad)
    assert passing.status == Status.SUCCEEDED, passing
    assert "Ran 2 tests" in only_step(passing)[1], passing
    # The attack: run in a namespace of its own, its suite found no test in __main__
    # ("Ran 0 tests ... OK") and the job read `succeeded`.
    failing = run(code=FAILING_SUITE + pad)
    stderr = only_step(failing)[1]
    assert "Ran 2 tests" in stderr and "FAILED (failures=1)" in stderr, failing
    assert failing.status == Status.FAILED, failing


def test_a_failing_doctest_fails_its_job(run, pad: str) -> None:
    result = run(code=FAILING_DOCTEST + pad)
    stdout = only_step(result)[0]
    assert "1 of   1 in __main__.add" in stdout, result  # it found and ran the example
    assert result.status == Status.FAILED, result


def test_the_code_runs_as_the_main_module(run, pad: str) -> None:
    result = run(code=MAIN_MODULE + pad)
    assert result.status == Status.SUCCEEDED, result
    assert only_step(result)[0].splitlines() == ["Point", "[1, 4, 9]", "True", "[]"], result


def test_a_killed_python_step_keeps_what_it_printed(run) -> None:
    code = "import time\nprint('test 1 passed')\ntime.sleep(30)\n"
    result = run(code=code, limits={"timeout_s": 2})
    assert result.status == Status.TIMED_OUT, result  # it was killed, not ended
    assert only_step(result)[0] == "test 1 passed\n", result


# Eight 100 KB lines while a 1 ms interval timer's handler interrupts every write: an
# unbuffered stdout (python -u) drops what a write cut short did not write (CPython issue
# 85393); a buffered one writes it all.
# It writes until the handler has run a few times (a fast host wrote 8 lines within the
# timer's first millisecond: the attack never ran), and says how many lines it wrote.
INTERRUPTED_WRITES = """
import signal, sys
fired = []
signal.signal(signal.SIGALRM, lambda *args: fired.append(1))
signal.setitimer(signal.ITIMER_REAL, 0.001, 0.001)
lines = 0
while lines < 8 or (len(fired) < 5 and lines < 5000):
    print("x" * 100_000)
    lines += 1
signal.setitimer(signal.ITIMER_REAL, 0)
print(f"handler ran {len(fired)} times, lines {lines}", file=sys.stderr)
"""


def test_writes_a_signal_handler_interrupts_lose_nothing(run) -> None:
    for _ in range(3):
        result = run(
            steps=[{"kind": "python", "code": INTERRUPTED_WRITES}],
            limits={"output_bytes": 1024 * 1024},
        )
        # the attack ran: the handler interrupted the writing program
        handled = result.steps[0].stderr.replace(",", "").split()
        assert handled[:2] == ["handler", "ran"] and int(handled[2]) > 0, result.steps[0].stderr
        lines = int(handled[-1])  # every byte of every line it wrote reached the worker
        assert result.steps[0].stdout_bytes == lines * 100_001, (lines, result.steps[0])
        assert result.status == Status.SUCCEEDED, result.message


@contextmanager
def signals_as_a_celery_pool_has_them() -> Iterator[None]:
    """SIGINT ignored, here, as Celery's pool process has it."""
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


SIGNAL_STATE = "grep -E '^Sig(Blk|Ign)' /proc/self/status"
SIGINT_BIT = 1 << (signal.SIGINT - 1)


def masks(text: str) -> dict[str, int]:
    return {line.split(":")[0]: int(line.split()[1], 16) for line in text.splitlines()}


def test_a_job_gets_no_signal_its_worker_ignores_or_blocks(run) -> None:
    with signals_as_a_celery_pool_has_them():
        # the attack is there: a plain child of this process inherits it (exec keeps
        # SIG_IGN)
        bare = subprocess.run(["sh", "-c", SIGNAL_STATE], capture_output=True, text=True)
        assert masks(bare.stdout)["SigIgn"] & SIGINT_BIT, bare.stdout
        direct = run(command=SIGNAL_STATE)  # one simple command: exec'd without bash
        scripted = run(command=f"{SIGNAL_STATE}; true")  # through bash
        interrupted = run(code="import os, signal\nos.kill(os.getpid(), signal.SIGINT)\n")
    for result in (direct, scripted):
        assert result.status == Status.SUCCEEDED, result
        seen = masks(only_step(result)[0])
        assert not seen["SigIgn"] & SIGINT_BIT and seen["SigBlk"] == 0, result
    # a Python job that interrupts itself ends with KeyboardInterrupt, as it would anywhere
    # (with SIGINT ignored it ran on: `succeeded`)
    assert interrupted.status == Status.CRASHED, interrupted
    assert "KeyboardInterrupt" in only_step(interrupted)[1], interrupted


def test_the_python_child_setup_gives_default_signals_too(is_root: bool) -> None:
    """The same without the exec helper (sandfarm-exec not built: the Python fallback)."""
    require(is_root, "the process backend's confinement needs root")
    backend = get_backend("process", exec_helper="")
    try:
        with signals_as_a_celery_pool_has_them():
            bare = subprocess.run(["sh", "-c", SIGNAL_STATE], capture_output=True, text=True)
            assert masks(bare.stdout)["SigIgn"] & SIGINT_BIT, bare.stdout  # the attack is there
            result = backend.run(parse_spec({"command": f"{SIGNAL_STATE}; true"}))
    finally:
        backend.close()
    assert result.status == Status.SUCCEEDED, result
    # (signals 32 and 33 are glibc's own, which no signal() call may touch: whatever this
    # process has for them, an earlier test's library may have set)
    seen = masks(only_step(result)[0])
    assert not seen["SigIgn"] & SIGINT_BIT and seen["SigBlk"] == 0, result


def test_a_job_whose_deadline_passed_before_its_steps_is_timed_out(run) -> None:
    """All its steps skipped (its deadline passed while its files were seeded): the job
    read `succeeded`, as no step it ran failed."""
    each = MAX_SEED_BYTES // MAX_SEED_FILES - 64
    files = {f"seed-{i}.txt": "x" * each for i in range(MAX_SEED_FILES)}
    result = run(files=files, command="exit 0", limits={"timeout_s": 0.001})
    assert result.steps and all(
        s.status in (StepStatus.SKIPPED, StepStatus.TIMED_OUT) for s in result.steps
    ), result
    assert result.status == Status.TIMED_OUT, result
    assert "deadline" in (result.message or "") or "limit" in (result.message or ""), result


HEAVY_FILES = 100_000


def test_a_jobs_heavy_teardown_is_its_own_time_not_the_next_jobs(is_root: bool) -> None:
    """A prewarmed worker tears a session down after its result is stored; a job that
    leaves a workspace slow to remove (many files) has that done in its own time, else
    the next job in the process (maybe another tenant's) waited for it, its timeout and
    fair-share charge running."""
    require(is_root, "prewarmed sandboxes need root")
    backend = get_backend(backend_config("process", slot=232, spare_slot=233))
    assert isinstance(backend, LocalBackend)
    require(backend.prewarms, "no exec helper built (make setup)")
    heavy = {
        "code": f"for i in range({HEAVY_FILES}):\n    open(f'f{{i}}', 'w').close()\n",
        "limits": {"timeout_s": 120, "workspace_mb": 512},  # room for the files' inodes
    }
    try:
        for _ in range(2):  # the second pair runs with both lanes' standbys in use
            filler = backend.run(parse_spec(heavy))
            after = backend.run(parse_spec({"command": "true", "limits": {"timeout_s": 1}}))
            assert filler.status == Status.SUCCEEDED, filler
            assert after.status == Status.SUCCEEDED, after
            teardown = filler.timings.phases.teardown_ms or 0.0
            waited = after.timings.phases.slot_wait_ms or 0.0
            # the attack ran: removing what the filler left took long, in its own time
            assert teardown >= 30, filler.timings
            assert waited < teardown / 2, (filler.timings, after.timings)
    finally:
        backend.close()

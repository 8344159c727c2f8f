"""Memory, CPU and file-size limits hold, and the host stays healthy.

Each attack is first shown to work where the limit is generous (the positive control),
so its failure under the tight limit is the limit's doing."""

from __future__ import annotations

import time

from sandbox_core import Status

MEMORY_BOMB = (
    "print('START', flush=True)\n"
    "x = bytearray(300 * 1024 * 1024)\n"
    "x[::4096] = b'y' * len(x[::4096])\n"
    "print('ALLOC')"
)


def test_memory_bomb_under_limit_is_memory_exceeded(run):
    roomy = run(code=MEMORY_BOMB, limits={"memory_mb": 1024})
    assert roomy.status == Status.SUCCEEDED, roomy  # the allocation itself is fine
    assert roomy.steps[0].stdout == "START\nALLOC\n"
    result = run(code=MEMORY_BOMB, limits={"memory_mb": 128})
    assert result.status == Status.MEMORY_EXCEEDED, result
    assert result.steps[0].message == "memory limit of 128 MB reached", result  # its own
    assert result.steps[0].stdout.startswith("START"), result  # the bomb ran
    assert "ALLOC" not in result.steps[0].stdout
    assert run(command="echo host-ok").steps[0].stdout == "host-ok\n"


SPLIT = (
    "import os, time\n"
    "pids = []\n"
    "for _ in range(4):\n"
    "    pid = os.fork()\n"
    "    if pid == 0:\n"
    "        x = bytearray(100 * 1024 * 1024); x[::4096] = b'y' * len(x[::4096])\n"
    "        time.sleep(2); os._exit(0)\n"
    "    pids.append(pid)\n"
    "print('FORKED', len(pids), flush=True)\n"
    "codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]\n"
    "print('CODES', *codes)\n"
    "print('ALL-ALIVE' if codes == [0, 0, 0, 0] else 'some-died')\n"
)


def test_memory_split_across_processes_is_capped(run):
    """Four 100 MB children each fit a per-process bound; only the job's own memory
    cgroup (256 MB for all of them) stops them."""
    roomy = run(code=SPLIT, limits={"memory_mb": 1024, "timeout_s": 20})
    assert "ALL-ALIVE" in roomy.steps[0].stdout, roomy  # the split works without the cap
    result = run(code=SPLIT, limits={"memory_mb": 256, "timeout_s": 20})
    out = result.steps[0].stdout
    assert "FORKED 4" in out, result  # the attack ran: four children
    assert "some-died" in out and "ALL-ALIVE" not in out, result
    codes = [int(code) for code in out.split("CODES", 1)[1].split("\n", 1)[0].split()]
    assert -9 in codes, f"no child was OOM-killed: {codes}"  # the cgroup's kill, not luck


def test_cpu_spin_hits_the_cpu_limit(run):
    started = time.monotonic()
    result = run(
        code="print('SPINNING', flush=True)\nwhile True: pass",
        limits={"cpu_s": 1, "timeout_s": 30},
    )
    assert result.status == Status.TIMED_OUT, result
    step = result.steps[0]
    assert step.stdout == "SPINNING\n", result  # the spin ran
    assert step.cpu_ms >= 900, result  # and really burnt the CPU second it was given
    assert "CPU" in (step.message or "")
    assert time.monotonic() - started < 15


def _write(limit_mb: int, run):
    return run(
        steps=[
            {"kind": "bash", "command": "head -c 5000000 /dev/zero > big"},
            {"kind": "bash", "command": "stat -c %s big"},
        ],
        limits={"file_size_mb": limit_mb},
    )


def test_writing_past_the_file_size_limit_fails(run):
    roomy = _write(16, run)
    assert [s.status for s in roomy.steps] == ["succeeded", "succeeded"], roomy
    assert int(roomy.steps[1].stdout) == 5_000_000  # the write works under a roomy limit
    result = _write(1, run)
    assert result.steps[0].status != "succeeded", result
    # the write ran up to the limit exactly, and no further
    assert int(result.steps[1].stdout) == 1024 * 1024, result


def test_python_write_past_file_size_limit_fails(run):
    def write(limit_mb: int):
        return run(
            steps=[
                {"kind": "python", "code": "open('big', 'wb').write(b'0' * 3_000_000)"},
                {"kind": "bash", "command": "stat -c %s big"},
            ],
            limits={"file_size_mb": limit_mb},
        )

    roomy = write(16)
    assert roomy.status == Status.SUCCEEDED, roomy
    assert int(roomy.steps[1].stdout) == 3_000_000
    result = write(1)
    assert result.status != Status.SUCCEEDED, result
    assert "File too large" in result.steps[0].stderr or result.steps[0].signal, result
    assert int(result.steps[1].stdout) <= 1024 * 1024, result  # the file exists, bounded

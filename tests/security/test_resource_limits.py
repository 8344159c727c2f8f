"""Memory, CPU and file-size limits hold, and the host stays healthy."""

from __future__ import annotations

import time

from sandbox_core import Status


def test_memory_bomb_under_limit_is_memory_exceeded(run):
    result = run(
        code="x = bytearray(300 * 1024 * 1024)\nx[::4096] = b'y' * len(x[::4096])\nprint('ALLOC')",
        limits={"memory_mb": 128},
    )
    assert result.status == Status.MEMORY_EXCEEDED, result
    assert "ALLOC" not in result.steps[0].stdout
    assert run(command="echo host-ok").steps[0].stdout == "host-ok\n"


def test_memory_split_across_processes_is_capped(run):
    code = (
        "import os\n"
        "for _ in range(4):\n"
        "    if os.fork() == 0:\n"
        "        x = bytearray(100 * 1024 * 1024); x[::4096] = b'y' * len(x[::4096])\n"
        "        import time; time.sleep(2); os._exit(0)\n"
        "ok = all(os.waitstatus_to_exitcode(os.wait()[1]) == 0 for _ in range(4))\n"
        "print('ALL-ALIVE' if ok else 'some-died')\n"
    )
    result = run(code=code, limits={"memory_mb": 256, "timeout_s": 20})
    assert "ALL-ALIVE" not in result.steps[0].stdout, result


def test_cpu_spin_hits_the_cpu_limit(run):
    started = time.monotonic()
    result = run(code="while True: pass", limits={"cpu_s": 1, "timeout_s": 30})
    assert result.status == Status.TIMED_OUT, result
    assert "CPU" in (result.steps[0].message or "")
    assert time.monotonic() - started < 15


def test_writing_past_the_file_size_limit_fails(run):
    result = run(
        steps=[
            {"kind": "bash", "command": "head -c 5000000 /dev/zero > big"},
            {"kind": "bash", "command": "stat -c %s big"},
        ],
        limits={"file_size_mb": 1},
    )
    assert result.steps[0].status != "succeeded", result
    assert int(result.steps[1].stdout) <= 1024 * 1024


def test_python_write_past_file_size_limit_fails(run):
    code = "open('big', 'wb').write(b'0' * 3_000_000)"
    result = run(code=code, limits={"file_size_mb": 1})
    assert result.status != Status.SUCCEEDED, result
    assert "File too large" in result.steps[0].stderr or result.steps[0].signal

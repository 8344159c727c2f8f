"""Output is bounded head + tail with true counts, whatever the job prints."""

from __future__ import annotations

import json
from pathlib import Path

from sandbox_core import Status

FLOOD = """
import sys
out = sys.stdout.buffer
out.write(b"FIRST LINE\\n")
block = b"x" * 1023 + b"\\n"
for _ in range({blocks}):
    out.write(block)
out.write(b"LAST LINE\\n")
"""


def _check_flood(result, blocks: int, budget: int) -> None:
    step = result.steps[0]
    assert result.status == Status.SUCCEEDED, result
    assert step.stdout.startswith("FIRST LINE\n")
    assert step.stdout.endswith("LAST LINE\n")
    assert step.stdout_bytes == len("FIRST LINE\n") + blocks * 1024 + len("LAST LINE\n")
    assert step.truncated
    kept = len(step.stdout.encode())
    assert kept <= budget + 100  # the budget plus the "bytes omitted" marker


def test_flood_of_300kb_keeps_head_and_tail(run):
    result = run(code=FLOOD.format(blocks=300), limits={"output_bytes": 8192})
    _check_flood(result, 300, 8192)


def _memory_kb(name: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{name}:"):
            return int(line.split()[1])
    raise AssertionError(f"no {name} in /proc/self/status")


def _reset_peak_rss() -> int:
    """Reset this process's peak RSS (VmHWM) to its current RSS, which it returns: unlike
    ru_maxrss (a lifetime peak, which earlier tests may have set high), VmHWM then shows
    the growth from here on."""
    Path("/proc/self/clear_refs").write_text("5")
    return _memory_kb("VmRSS")


def _growth_kb(base_kb: int) -> int:
    return _memory_kb("VmHWM") - base_kb


def test_flood_of_1gb_is_bounded_in_worker_memory(run):
    # positive control: the measure sees a 64 MiB growth in this process
    base = _reset_peak_rss()
    ballast = bytearray(64 * 1024 * 1024)
    ballast[::4096] = b"y" * len(ballast[::4096])
    assert _growth_kb(base) >= 60 * 1024
    del ballast
    blocks = 1024 * 1024  # 1 GiB
    base = _reset_peak_rss()
    result = run(
        code=FLOOD.format(blocks=blocks),
        limits={"output_bytes": 65536, "flood_kill_bytes": 2 * 1024**3, "timeout_s": 120},
    )
    grown_kb = _growth_kb(base)
    _check_flood(result, blocks, 65536)  # the whole GiB went through the worker
    assert grown_kb < 32 * 1024, f"worker RSS grew by {grown_kb} KiB"


def test_flood_past_the_kill_threshold_is_stopped(run):
    result = run(command="yes flood", limits={"flood_kill_bytes": 1024 * 1024, "timeout_s": 20})
    step = result.steps[0]
    assert result.status == Status.OUTPUT_FLOODED, result
    assert step.stdout.startswith("flood\n"), result  # the flood ran
    assert step.status.value == "output_flooded"
    assert step.stdout_bytes >= 1024 * 1024
    assert step.duration_ms < 10_000


def test_stderr_flood_is_bounded_too(run):
    result = run(command="head -c 2000000 /dev/zero | tr '\\0' e >&2; echo done")
    step = result.steps[0]
    assert step.stderr_bytes == 2_000_000, result
    assert step.stderr.startswith("eeee") and step.stderr.endswith("eeee")  # head and tail
    assert len(step.stderr) < 70_000
    assert step.stdout == "done\n"


def test_invalid_utf8_output_yields_valid_json(run):
    result = run(command="printf 'ok \\xff\\xfe\\xc3 end\\n'; printf '\\x80\\x81' >&2")
    document = json.loads(result.model_dump_json())
    assert "\ufffd" in document["steps"][0]["stdout"]
    assert document["steps"][0]["stdout"].startswith("ok ")
    assert document["steps"][0]["stderr_bytes"] == 2


def test_reading_a_huge_sparse_file_costs_the_worker_its_head_and_tail(run):
    """A read_file step keeps the file's head and tail and counts the rest: a job that
    reads a 4 GB sparse file (no disk, no memory, no CPU of its own) ten times must not
    make the worker read 40 GB, CPU no limit of the job's counts (an attack review)."""
    import resource

    def worker_cpu() -> float:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime

    size = 4095 * 1024 * 1024
    make = (
        "with open('big', 'wb') as f:\n"
        "    f.write(b'FIRST'); f.seek(" + str(size - 4) + "); f.write(b'LAST')\n"
    )
    reads = [{"kind": "read_file", "path": "big"}] * 10
    before = worker_cpu()
    result = run(
        steps=[{"kind": "python", "code": make}, *reads],
        limits={"file_size_mb": 4096, "output_bytes": 8192},
    )
    spent = worker_cpu() - before
    assert result.status == Status.SUCCEEDED, result
    for step in result.steps[1:]:  # each read ran over the whole file: the attack ran
        assert step.stdout_bytes == size, step
        assert step.stdout.startswith("FIRST") and step.stdout.endswith("LAST"), step
        assert step.truncated
    assert spent < 1.0, spent  # read whole, 40 GB: seconds of the worker's CPU

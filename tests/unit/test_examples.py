"""The example batches are valid, labelled, and in sync with examples/build.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from producer.batch import parse_line
from sandbox_core import JobSpec, Status

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_generated_files_match_the_source() -> None:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / "build.py"), "--check"], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("name", ["trajectories.jsonl", "humaneval.jsonl"])
def test_every_example_is_a_valid_labelled_spec(name: str) -> None:
    lines = (EXAMPLES / name).read_text().splitlines()
    expects = set()
    for number, text in enumerate(lines, start=1):
        spec = parse_line(name, number, text)
        assert isinstance(spec, JobSpec), f"{name}:{number}: {spec}"
        expects.add(Status(spec.labels["expect"]))
        assert spec.labels["task"]
    assert Status.SUCCEEDED in expects and Status.FAILED in expects
    assert Status.TIMED_OUT in expects


def test_trajectories_cover_every_abnormal_end() -> None:
    lines = (EXAMPLES / "trajectories.jsonl").read_text().splitlines()
    expects = {json.loads(line)["labels"]["expect"] for line in lines}
    assert {"output_flooded", "memory_exceeded", "crashed", "timed_out", "failed"} <= expects
    assert 20 <= len(lines) <= 30


def test_invalid_example_has_good_and_bad_lines() -> None:
    lines = (EXAMPLES / "invalid.jsonl").read_text().splitlines()
    parsed = [parse_line("invalid.jsonl", n, t) for n, t in enumerate(lines, start=1)]
    assert [isinstance(p, JobSpec) for p in parsed] == [True] + [False] * 6 + [True]

"""What collecting a job's files may cost the worker: patterns are matched by the worker,
on no job's CPU and after the job's steps, so a pattern whose regex backtracks over long
paths made one job cost the worker ~23 s of CPU per pattern (up to 32), past the job's
timeout (an attack review). Patterns are at most COLLECT_MAX_PATTERN_BYTES and matching
stops after COLLECT_MATCH_S, saying so."""

from __future__ import annotations

import fnmatch
import re
import time

import pytest

from sandbox_core import SpecError, parse_spec
from sandbox_core import defaults as d
from sandbox_core.collectmatch import Matcher, OutOfTime
from tests.security.helpers import backend_kind

# A chain of 14 directories of 250-character names, and 9,000 files at its end: every
# path ~3.7 KB, each tried against every pattern.
LONG_PATHS = r"""
import os
d = "/".join(["a" * 250] * 14)
os.makedirs(d)
for i in range(9000):
    open(os.path.join(d, "%04d" % i + "a" * 150), "w").close()
print(len(d) + 155)
"""
# The longest pattern allowed: "*", then fixed-width runs the regex retries from every
# position the "*" could end at (a [/a] class lets it span directories).
SLOW = "*" + ("?" * 60 + "[/a]") * 3 + "?" * 20 + "b"  # 214 bytes; +31 "?" at most


def _paths() -> list[str]:
    d_ = "/".join(["a" * 250] * 14)
    return [f"{d_}/{i:04d}" + "a" * 150 for i in range(9000)]


def test_a_pattern_costs_the_worker_at_most_its_time(run):
    assert len(SLOW.encode()) <= d.COLLECT_MAX_PATTERN_BYTES
    patterns = [SLOW + "?" * k for k in range(d.MAX_COLLECT_PATTERNS)]
    # The attack, unconfined: 200 of the job's paths against every pattern, timed, and
    # extrapolated to all of them: far past the matching time.
    paths = _paths()
    compiled = [re.compile(fnmatch.translate(p)) for p in patterns]
    start = time.perf_counter()
    for path in paths[:200]:
        assert not any(c.match(path) for c in compiled)
    unbounded_s = (time.perf_counter() - start) * len(paths) / 200
    assert unbounded_s > 10 * d.COLLECT_MATCH_S, unbounded_s
    result = run(code=LONG_PATHS, collect=patterns, limits={"timeout_s": 60})
    assert result.steps[0].status == "succeeded", result.steps[0]  # the tree was made
    assert int(result.steps[0].stdout) > 3500  # paths of ~3.7 KB
    collect_ms = result.timings.phases.collect_ms
    assert collect_ms is not None and collect_ms < 1000 * (d.COLLECT_MATCH_S + 2), collect_ms
    assert "collect stopped after" in (result.message or ""), result.message
    assert result.files == []


@pytest.mark.no_backend
def test_a_pattern_over_its_bound_is_refused_naming_it():
    with pytest.raises(SpecError) as caught:
        parse_spec({"command": "true", "collect": ["out/*", "x" * 257]})
    assert caught.value.field == "collect.1" and "257 bytes" in caught.value.reason


@pytest.mark.no_backend
def test_matching_stops_once_its_time_is_up():
    matcher = Matcher(["*.txt"], budget_s=1.0)
    assert matcher.matches("a/b.txt") and not matcher.matches("a/b.py")
    time.sleep(1.05)
    with pytest.raises(OutOfTime):
        matcher.matches("c.txt")


def test_text_files_come_back_as_text_on_every_backend(run):
    """Docker budgeted each collected file by its raw size: any newline, quote or tab
    made its JSON longer, so every ordinary text file came back as base64 of three
    quarters of it, marked truncated (a review). Now as L1/L2: by its size serialised."""
    code = (
        "open('out.txt', 'w').write('line one\\nline \"two\"\\n')\n"
        "open('big.txt', 'w').write(''.join(f'{i}\\n' for i in range(1, 20001)))"
    )
    result = run(code=code, collect=["*.txt"])
    assert result.status == "succeeded", result
    files = {f.path: f for f in result.files}
    assert files["out.txt"].content == 'line one\nline "two"\n', files["out.txt"]
    big = files["big.txt"]
    assert (big.encoding, big.truncated) == ("utf-8", False), (big.encoding, big.truncated)
    assert big.content == "".join(f"{i}\n" for i in range(1, 20001))
    assert result.files_omitted == 0


# A chain of 16,000 directories of 250-character names, made a step at a time, and a
# file at its end: one relative path of ~4 MB (a container's listing carries it whole).
ONE_HUGE_PATH = r"""
import os
for _ in range(16000):
    os.mkdir("d" * 250); os.chdir("d" * 250)
open("end.txt", "w").write("x")
print("made")
"""


def test_one_huge_path_costs_the_worker_nothing_to_match(run):
    """The time was checked between names only: one path of 4 MB in a container's
    listing, against 32 patterns, cost the worker 17.9 s, the job not even told (a
    review). A path past PATH_MAX matches nothing (it could not be opened anyway)."""
    patterns = [SLOW + "?" * k for k in range(d.MAX_COLLECT_PATTERNS)]
    result = run(code=ONE_HUGE_PATH, collect=patterns, limits={"timeout_s": 60})
    assert result.steps[0].stdout == "made\n", result.steps[0]
    collect_ms = result.timings.phases.collect_ms
    assert collect_ms is not None and collect_ms < 1000 * (d.COLLECT_MATCH_S + 2), collect_ms


@pytest.mark.no_backend
def test_a_path_past_path_max_matches_nothing_at_once():
    huge = "d" * 250 + "/" + ("d" * 250 + "/") * 16000 + "end.txt"
    matcher = Matcher(["*"], budget_s=60)
    start = time.perf_counter()
    assert not matcher.matches(huge) and matcher.matches("end.txt")
    assert time.perf_counter() - start < 0.1


def test_files_with_long_names_all_come_back_where_they_can_be_opened(run, backend):
    """Docker's tar stream was sized at 2 KB a file; a name of ~4 KB takes its own header
    and blocks, so of 60 two-byte files with such names 35 were reported omitted (a
    review). L1/L2 open files by their absolute path, which these names take past
    PATH_MAX: omitted there, and counted."""
    code = (
        "import os\n"
        "d = '/'.join(['n' * 200] * 19)\n"
        "os.makedirs(d)\n"
        "for i in range(60):\n"
        "    open(os.path.join(d, f'{i:02d}'), 'w').write('ok')\n"
    )
    result = run(code=code, collect=["n*"])
    assert result.status == "succeeded", result
    if backend_kind(backend) == "docker":
        assert len(result.files) == 60 and result.files_omitted == 0, result.files_omitted
        assert all(f.content == "ok" for f in result.files)
    else:
        assert len(result.files) + result.files_omitted == 60


def test_a_directory_the_job_made_unreadable_costs_it_only_that_directory(run):
    """Docker listed the workspace with one `find`, which fails on a directory it cannot
    read: a step's `chmod 000` failed the job's `read_file` and every collect (an attack
    review). Each backend now leaves such a directory out and keeps the rest."""
    result = run(
        steps=[
            {"kind": "bash", "command": "echo result > out.txt; mkdir private; chmod 000 private"},
            {"kind": "bash", "command": "ls private"},  # the trap is set: unreadable
            {"kind": "read_file", "path": "out.txt"},
        ],
        collect=["out.txt"],
    )
    assert result.steps[1].exit_code != 0 and "ermission denied" in result.steps[1].stderr
    assert result.steps[2].status == "succeeded", result.steps[2]
    assert result.steps[2].stdout == "result\n"
    assert [f.path for f in result.files] == ["out.txt"], result

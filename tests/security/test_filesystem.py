"""The path guard: nothing outside the workspace is read or written through the farm."""

from __future__ import annotations

import os

import pytest

from sandbox_core import PathEscapeError, SpecError, Status, parse_spec
from sandbox_core.pathguard import resolve_inside


@pytest.mark.parametrize("path", ["../../etc/passwd", "/etc/passwd", "a/../../x", "a\x00b"])
def test_bad_paths_are_refused_at_validation(path):
    for spec in (
        {"steps": [{"kind": "read_file", "path": path}]},
        {"steps": [{"kind": "write_file", "path": path, "content": "x"}]},
        {"command": "true", "files": {path: "x"}},
    ):
        with pytest.raises(SpecError):
            parse_spec(spec)


def test_symlink_to_etc_is_refused_for_reads_and_writes(run):
    target = "/etc/sandfarm-should-not-exist"
    result = run(
        steps=[
            {"kind": "bash", "command": "ln -s /etc link && ln -s /etc/passwd pw"},
            {"kind": "read_file", "path": "link/passwd"},
            {"kind": "read_file", "path": "pw"},
            {"kind": "write_file", "path": "link/sandfarm-should-not-exist", "content": "x"},
        ],
        collect=["*"],
    )
    read_dir, read_link, write = result.steps[1:]
    for step in (read_dir, read_link, write):
        assert step.status == "failed", step
        assert "root:" not in step.stdout
    assert read_dir.message  # a reason is given (host backends: "leads outside the workspace")
    assert not os.path.exists(target)
    assert all("root:" not in f.content for f in result.files)
    assert {f.path for f in result.files} == set()  # symlinks are never collected


def test_resolve_inside_refuses_symlink_out(tmp_path):
    (tmp_path / "link").symlink_to("/etc")
    with pytest.raises(PathEscapeError):
        resolve_inside(tmp_path, "link/passwd")
    assert resolve_inside(tmp_path, "ok/file") == str(tmp_path / "ok" / "file")


def test_collect_is_bounded(run):
    result = run(
        command="for i in $(seq 100); do echo $i > f$i.txt; done; head -c 600000 /dev/zero >b.bin",
        collect=["*.txt", "*.bin"],
    )
    assert result.status == Status.SUCCEEDED
    assert len(result.files) <= 64
    assert result.files_omitted >= 100 + 1 - 64
    assert sum(len(f.content) for f in result.files) <= 1024 * 1024 * 4 // 3 + 1


def test_job_cannot_redirect_the_workers_own_writes(run):
    """The worker writes step scripts as root beside the workspace; a job that swaps
    that directory for a symlink must not make the worker write into the host."""
    result = run(
        steps=[
            {"kind": "bash", "command": "cd ..; mv scripts s2 && ln -s /etc scripts; true"},
            {"kind": "bash", "command": "echo second step"},
        ]
    )
    assert not os.path.exists("/etc/step-1")
    assert result.steps[1].stdout == "second step\n"


def test_stdin_reaches_the_step(run):
    result = run(
        steps=[
            {"kind": "python", "code": "import sys; print(sys.stdin.read()[::-1])", "stdin": "abc"}
        ]
    )
    assert result.steps[0].stdout == "cba\n", result

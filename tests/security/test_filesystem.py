"""The path guard: nothing outside the workspace is read or written through the farm."""

from __future__ import annotations

import os

import pytest

from sandbox_core import PathEscapeError, SpecError, Status, parse_spec
from sandbox_core.pathguard import resolve_inside


@pytest.mark.no_backend
@pytest.mark.parametrize("path", ["../../etc/passwd", "/etc/passwd", "a/../../x", "a\x00b"])
def test_bad_paths_are_refused_at_validation(path):
    # positive control: the same specs with a good path are valid
    parse_spec({"steps": [{"kind": "read_file", "path": "ok/file"}]})
    parse_spec({"steps": [{"kind": "write_file", "path": "ok/file", "content": "x"}]})
    parse_spec({"command": "true", "files": {"ok/file": "x"}})
    for spec in (
        {"steps": [{"kind": "read_file", "path": path}]},
        {"steps": [{"kind": "write_file", "path": path, "content": "x"}]},
        {"command": "true", "files": {path: "x"}},
    ):
        with pytest.raises(SpecError):
            parse_spec(spec)


def test_symlink_to_etc_is_refused_for_reads_and_writes(run):
    target = "/etc/sandfarm-should-not-exist"
    assert not os.path.exists(target)
    result = run(
        steps=[
            {"kind": "bash", "command": "ln -s /etc link && ln -s /etc/passwd pw && readlink pw"},
            {"kind": "read_file", "path": "link/passwd"},
            {"kind": "read_file", "path": "pw"},
            {"kind": "write_file", "path": "link/sandfarm-should-not-exist", "content": "x"},
            # positive controls: the same steps on a real file of the workspace work
            {"kind": "write_file", "path": "real.txt", "content": "fine"},
            {"kind": "read_file", "path": "real.txt"},
        ],
        collect=["*"],
    )
    plant, read_dir, read_link, write, write_ok, read_ok = result.steps
    assert plant.status == "succeeded" and plant.stdout == "/etc/passwd\n", result
    assert write_ok.status == "succeeded" and read_ok.stdout == "fine", result
    for step in (read_dir, read_link, write):
        assert step.status == "failed", step
        assert "root:" not in step.stdout
    assert read_dir.message  # a reason is given (host backends: "leads outside the workspace")
    assert not os.path.exists(target)
    assert all("root:" not in f.content for f in result.files)
    # the real file is collected, the symlinks never are
    assert {f.path: f.content for f in result.files} == {"real.txt": "fine"}


@pytest.mark.no_backend
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
    assert result.status == Status.SUCCEEDED, result
    assert len(result.files) == 64  # collected up to the bound, and no further
    assert len(result.files) + result.files_omitted == 100 + 1  # every match was counted
    assert sum(len(f.content) for f in result.files) <= 1024 * 1024 * 4 // 3 + 1


SWAP = """
d=$(dirname "$(readlink -f "$0")")
[ -d "$d" ] || d=$PWD  # docker runs steps as bash -c: its writes go to the workspace
echo "ATTACKING $d"
mv "$d" "$d.moved" && ln -s /etc "$d" && echo SWAPPED || echo SWAP-REFUSED
"""


def test_job_cannot_redirect_the_workers_own_writes(run):
    """The worker writes step scripts as root beside the workspace; a job that swaps
    that directory (the one its own step script is in) for a symlink must not make the
    worker write into the host."""
    result = run(
        steps=[
            {"kind": "bash", "command": SWAP},
            {"kind": "write_file", "path": "after.txt", "content": "written"},
            {"kind": "bash", "command": "echo second step; cat after.txt"},
        ]
    )
    attack = result.steps[0].stdout if result.steps else ""
    assert "ATTACKING /" in attack, result  # the attack found its target and ran
    assert "SWAPPED" in attack or "SWAP-REFUSED" in attack, result
    for leaked in ("/etc/step-0", "/etc/step-1", "/etc/step-2", "/etc/after.txt"):
        assert not os.path.exists(leaked)
    assert result.steps[2].stdout == "second step\nwritten", result


def test_stdin_reaches_the_step(run):
    result = run(
        steps=[
            {"kind": "python", "code": "import sys; print(sys.stdin.read()[::-1])", "stdin": "abc"}
        ]
    )
    assert result.steps[0].stdout == "cba\n", result


LONG_LISTING = """
import os
d = "D" * 240
os.mkdir(d)
for i in range(11_000):  # ~5 MB of names: past docker's 4 MiB workspace listing
    open(os.path.join(d, f"{i:06d}" + "n" * 224), "w").close()
print("made")
"""


def test_a_long_workspace_listing_does_not_break_collect(run):
    """A listing of the workspace cut at its budget ended mid-name on docker, and that
    partial path failed the whole collect: no file, and `files_omitted` 0 (an attack
    review). The files the listing holds are still collected."""
    result = run(code=LONG_LISTING, collect=["D*/*"], limits={"timeout_s": 120})
    assert result.status == Status.SUCCEEDED and result.steps[0].stdout == "made\n", result
    assert "collecting files failed" not in (result.message or ""), result.message
    assert result.files, result  # collected up to the bound ...
    assert len(result.files) + result.files_omitted >= 64, result.files_omitted  # ... counted

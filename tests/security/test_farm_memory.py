"""All of a worker's jobs together are bounded below the host's RAM.

Each job's memory_mb (up to 16 GiB) and workspace_mb (a tmpfs, up to 8 GiB) are bounded
one by one, and a worker runs several jobs at once: at the maximums they ask for more
than the host has, and a tmpfs file belongs to no process, so a host-wide OOM would
kill a host service (Redis, dockerd) first. The farm's parent memory cgroup is limited
to the host's RAM less a reserve (sandbox_core.cgroups.farm_memory_limit), so the jobs
OOM in their own group instead.

The test never asks for more than the host has: the bound is made small, on parent
groups of the test's own name (cgroups.PARENT_NAME patched), never on the real ones,
which other tests in this process and the workers' jobs share. Docker's containers are
the engine's cgroups, each bounded by its own limit, not under the farm's parent."""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sandbox_core import Backend, JobResult, Status, cgroups, parse_spec
from sandbox_core import defaults as d
from sandbox_core.memorybound import bound_farm_memory
from tests.conftest import require
from tests.security.conftest import make_backend
from tests.security.helpers import backend_kind

ASKED_MB = 600  # what the job takes, and holds
ROOMY_MB = 2048  # a farm bound the job fits under (the control)
SMALL_MB = 300  # a farm bound it does not
JOB_LIMITS = {"memory_mb": 1024, "workspace_mb": 1024, "file_size_mb": 1024, "timeout_s": 60}

# The two ways a job holds memory: pages of its own process, and tmpfs files, which stay
# charged to its group after any process is killed. Each prints DONE only once all of it
# is held.
ATTACKS = {
    "process": {
        "kind": "python",
        "code": "print('START', flush=True)\n"
        f"x = bytearray({ASKED_MB} * 1024 * 1024)\n"
        "x[::4096] = b'y' * len(x[::4096])\n"
        "print('DONE', len(x) >> 20, flush=True)\n",
    },
    "tmpfs": {
        "kind": "bash",
        "command": f"echo START; head -c {ASKED_MB}M /dev/zero > fill && echo DONE"
        " $(( $(stat -c %s fill) >> 20 ))",
    },
}

SetBound = Callable[[int], cgroups.CgroupLayout]
TEST_PARENT = f"sandfarm-memtest-{os.getpid()}"


def _limit_file(layout: cgroups.CgroupLayout) -> Path:
    assert layout.memory is not None, layout.problems
    return layout.memory / ("memory.max" if layout.memory_v2 else "memory.limit_in_bytes")


def _remove_test_groups(layout: cgroups.CgroupLayout) -> None:
    """The test's parent groups and whatever slot groups are left in them."""
    for base in layout.bases:
        assert base.name == TEST_PARENT, base  # never a real parent's
        for child in [p for p in base.iterdir() if p.is_dir()] if base.is_dir() else []:
            with contextlib.suppress(OSError):
                child.rmdir()
        with contextlib.suppress(OSError):
            base.rmdir()


@pytest.fixture
def real_layout() -> cgroups.CgroupLayout:
    require(os.geteuid() == 0, "needs root: the farm's cgroups")
    cgroups.detect.cache_clear()
    layout = cgroups.detect()
    require(layout.memory is not None, f"no memory cgroup: {layout.problems}")
    return layout


@pytest.fixture
def own_farm_group(real_layout: cgroups.CgroupLayout) -> Iterator[SetBound]:
    """Sets the farm's memory bound (MiB) on parent groups named for this test alone;
    afterwards they are removed and detect() again gives the real parents."""
    made: list[cgroups.CgroupLayout] = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cgroups, "PARENT_NAME", TEST_PARENT)

        def set_bound(mb: int) -> cgroups.CgroupLayout:
            patch.setattr(cgroups, "farm_memory_limit", lambda: mb * d.MIB)
            cgroups.detect.cache_clear()
            made.append(cgroups.detect())
            return made[-1]

        try:
            yield set_bound
        finally:
            cgroups.detect.cache_clear()
            if made:  # one set of groups, its bound rewritten each time
                _remove_test_groups(made[-1])
    cgroups.detect.cache_clear()  # the real parents, for every later test


def _run(sandbox: Backend, attack: str) -> JobResult:
    return sandbox.run(parse_spec({"steps": [ATTACKS[attack]], "limits": JOB_LIMITS}))


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_jobs_together_are_bounded_below_the_hosts_ram(
    real_layout: cgroups.CgroupLayout, own_farm_group: SetBound, backend: Backend, attack: str
) -> None:
    kind = backend_kind(backend)
    if kind == "docker":
        pytest.skip("a container's memory is the engine's cgroup, bounded per container")
    # The real parent has its bound (detect() wrote it): the host's RAM less the reserve.
    real_limit = _limit_file(real_layout).read_text()
    assert real_layout.memory_bound == cgroups.farm_memory_limit(), real_layout.problems
    bound = real_layout.memory_bound
    assert bound is not None and int(real_limit) == bound < (cgroups.mem_total() or 0)

    sandbox = make_backend(kind, prewarm=False)  # no standby beside the job in the group
    try:
        roomy_layout = own_farm_group(ROOMY_MB)
        roomy = _run(sandbox, attack)
        layout = own_farm_group(SMALL_MB)
        result = _run(sandbox, attack)
        after = sandbox.run(parse_spec({"command": "echo host-ok"}))
    finally:
        sandbox.close()

    # The control: under a roomy bound the job takes and holds all it asked for.
    assert roomy_layout.memory_bound == ROOMY_MB * d.MIB, roomy_layout.problems
    assert roomy.status == Status.SUCCEEDED, roomy
    assert f"DONE {ASKED_MB}" in roomy.steps[0].stdout, roomy
    # The attack ran, within the job's own limits, and the farm's bound stopped it.
    assert _limit_file(layout).read_text().strip() == str(SMALL_MB * d.MIB)
    assert layout.memory_bound == SMALL_MB * d.MIB, layout.problems
    assert result.steps[0].stdout.startswith("START"), result
    assert "DONE" not in result.steps[0].stdout, result
    # the OOM killer took it in the farm's group (a tmpfs file too: the writer is killed),
    # and the result says whose bound it was: not the job's own limit
    assert result.status == Status.MEMORY_EXCEEDED, result
    assert result.steps[0].message == (
        "the farm's memory bound for all jobs together was reached"
        f" (this job's own limit of {JOB_LIMITS['memory_mb']} MB was not)"
    ), result
    # The host is intact: the next job runs, and the real parent's bound is unchanged.
    assert after.status == Status.SUCCEEDED and after.steps[0].stdout == "host-ok\n", after
    assert _limit_file(real_layout).read_text() == real_limit


@pytest.mark.no_backend  # the bound's file handling, on files standing in for a group's
@pytest.mark.parametrize("v2", [True, False], ids=["v2", "v1"])
def test_the_bound_is_written_once_and_a_refusal_is_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, v2: bool
) -> None:
    name, unlimited = ("memory.max", "max") if v2 else ("memory.limit_in_bytes", str(2**63 - 4096))
    (tmp_path / name).write_text(unlimited)
    problems: list[str] = []
    assert bound_farm_memory(tmp_path, v2, problems, 300 * d.MIB) == 300 * d.MIB
    assert (tmp_path / name).read_text() == str(300 * d.MIB) and problems == []
    writes: list[Path] = []
    monkeypatch.setattr(Path, "write_text", lambda path, *_a, **_k: writes.append(path))
    assert bound_farm_memory(tmp_path, v2, problems, 300 * d.MIB) == 300 * d.MIB
    assert writes == []  # the same limit is not written again (every process calls detect)
    assert bound_farm_memory(tmp_path, v2, problems, 400 * d.MIB) == 300 * d.MIB
    assert writes == []  # nor over a lower one (an operator's: a review found it raised)
    # a write the kernel refuses (v1: EBUSY below the usage): the worker goes on with the
    # limit in force, and doctor says why
    monkeypatch.setattr(Path, "write_text", _refused)
    assert bound_farm_memory(tmp_path, v2, problems, 200 * d.MIB) == 300 * d.MIB
    assert len(problems) == 1 and "Device or resource busy" in problems[0], problems


def _refused(path: Path, *_args: object, **_kwargs: object) -> int:
    raise OSError(errno.EBUSY, os.strerror(errno.EBUSY), str(path))

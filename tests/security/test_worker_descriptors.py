"""The worker keeps its slot's cgroup files open job after job (sandbox_core/cgroupfiles.py);
a job never holds one of them, or any other descriptor of the worker's, warm or cold."""

from __future__ import annotations

import os

from sandbox_core import Backend, JobResult, Status, parse_spec
from sandbox_core.backends import prewarm
from tests.conftest import require
from tests.security.helpers import backend_kind

# every descriptor the job's process holds, and what it points to (listdir's own is gone)
LIST_FDS = (
    "python3 -c \"import os; d = '/proc/self/fd/';"
    ' [print(f, os.readlink(d + f)) for f in os.listdir(d) if os.path.exists(d + f)]"'
)


def _worker_cgroup_fds() -> list[str]:
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if "/sys/fs/cgroup/" in target and "slot" in target:
            found.append(target)
    return found


def _stdio_only(result: JobResult) -> None:
    assert result.status == Status.SUCCEEDED, result
    lines = result.steps[0].stdout.splitlines()
    assert any(line.startswith("1 ") for line in lines), lines  # it ran
    assert not [line for line in lines if "cgroup" in line], lines
    assert {int(line.split()[0]) for line in lines} <= {0, 1, 2}, lines  # stdio only


def test_a_job_holds_none_of_the_workers_descriptors(backend: Backend, is_root: bool) -> None:
    first = backend.run(parse_spec({"command": "echo ran"}))
    assert first.status == Status.SUCCEEDED and first.steps[0].stdout == "ran\n", first
    if backend_kind(backend) == "docker":  # a container: the worker's files are not there
        _stdio_only(backend.run(parse_spec({"command": LIST_FDS})))
        return
    require(is_root, "slot cgroups need root")
    prewarm.settle()
    # what there is to steal: this process (the worker) holds its slot's cgroup files
    require(bool(_worker_cgroup_fds()), "this host gives the slot no cgroup (none kept open)")
    for warm in (True, False):
        # a workspace of another size than the standby's runs cold
        limits = {} if warm else {"workspace_mb": 255}
        result = backend.run(parse_spec({"command": LIST_FDS, "limits": limits}))
        assert result.timings.phases.prewarmed is warm, result.timings.phases
        _stdio_only(result)
        prewarm.settle()
    assert _worker_cgroup_fds(), "the worker closed them: the attack had nothing to take"

"""The worker keeps its slot's cgroup files open job after job (sandbox_core/cgroupfiles.py);
a job never holds one of them, or any other descriptor of the worker's."""

from __future__ import annotations

import os

from sandbox_core import Status, get_backend, parse_spec
from sandbox_core.backends import prewarm
from tests.conftest import require

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


def test_a_job_holds_none_of_the_workers_descriptors(is_root):
    require(is_root, "slot cgroups need root")
    backend = get_backend("process")
    try:
        first = backend.run(parse_spec({"command": "echo ran"}))
        assert first.status == Status.SUCCEEDED and first.steps[0].stdout == "ran\n", first
        prewarm.settle()
        # what there is to steal: this process (the worker) holds its slot's cgroup files
        held = _worker_cgroup_fds()
        require(bool(held), "this host gives the slot no cgroup (nothing is kept open)")
        for warm in (True, False):
            # a workspace of another size than the standby's runs cold
            limits = {} if warm else {"workspace_mb": 255}
            spec = parse_spec({"command": LIST_FDS, "limits": limits})
            result = backend.run(spec)
            assert result.status == Status.SUCCEEDED, result
            assert result.timings.phases.prewarmed is warm, result.timings.phases
            lines = result.steps[0].stdout.splitlines()
            assert any(line.startswith("1 ") for line in lines), lines  # it ran
            assert not [line for line in lines if "cgroup" in line], lines
            numbers = {int(line.split()[0]) for line in lines}
            assert numbers <= {0, 1, 2}, lines  # stdio only
            prewarm.settle()
        assert _worker_cgroup_fds(), "the worker closed them: the attack had nothing to take"
    finally:
        backend.close()

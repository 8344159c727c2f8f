"""A slot's cgroup files kept open (sandbox_core/cgroupfiles.py) against real cgroups: a
group made anew under the same name is still the one counted and killed."""

from __future__ import annotations

import os
import subprocess
import time

from sandbox_core import cgroups
from sandbox_core.cgroups import JobCgroup
from tests.conftest import require


def _join(group: JobCgroup, pid: int) -> None:
    for procs in group.procs_files:
        with open(procs, "w") as f:
            f.write(str(pid))


def test_a_group_made_anew_is_still_the_one_killed(is_root):
    require(is_root and cgroups.detect().can_kill_tree, "needs root and a cgroup tree kill")
    name = f"openfiles-test-{os.getpid()}"
    group = JobCgroup.create(name, 64 * 1024 * 1024, 64)
    sleeper = None
    try:
        # the files are open now: procs, the CPU counter, and the kill file
        assert group.empty() and group.cpu_ns() >= 0 and group.kill(wait_s=1)
        opened = {path.name for path, _ in group.files._fds}
        kill_file = {"cgroup.kill"} if group.layout.kill_v2 is not None else set()
        assert {"cgroup.procs", *kill_file} <= opened, opened
        for path in list(group.dirs):
            path.rmdir()  # as if someone removed and remade the slot's group
            path.mkdir()
        sleeper = subprocess.Popen(["sleep", "60"])
        _join(group, sleeper.pid)
        assert sleeper.pid in group.pids()  # the attack: a process in the new group
        assert not group.empty()  # seen through the reopened file, not the stale one
        assert group.kill(wait_s=5)
        sleeper.wait(timeout=5)
        assert sleeper.returncode == -9
        busy = subprocess.Popen(["sh", "-c", "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done"])
        _join(group, busy.pid)
        busy.wait(timeout=60)
        time.sleep(0.05)
        assert group.cpu_ns() > 0  # counted in the new group's counter
    finally:
        if sleeper is not None and sleeper.poll() is None:
            sleeper.kill()
        group.kill()
        group.remove()


def test_a_v1_group_is_read_afresh(is_root):
    """cgroup v1 keeps an open cgroup.procs' pid list for a second: never trust it."""
    require(is_root and cgroups.detect().can_kill_tree, "needs root and a cgroup tree kill")
    group = JobCgroup.create(f"openfiles-v1-{os.getpid()}", 64 * 1024 * 1024, 64)
    v1 = [p for p in group.dirs if p.parent != group.layout.kill_v2]
    sleeper = None
    try:
        require(bool(v1), "no cgroup v1 hierarchy here")
        assert group.empty(v1)  # read once: a kept-open file would cache this
        sleeper = subprocess.Popen(["sleep", "60"])
        _join(group, sleeper.pid)
        for path in v1:
            assert str(sleeper.pid) in (path / "cgroup.procs").read_text()  # it is there
            assert not group.empty([path])  # and seen at once
    finally:
        if sleeper is not None:
            sleeper.kill()
            sleeper.wait()
        group.kill()
        group.remove()

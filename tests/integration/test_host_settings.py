"""Host settings the project applies itself: cgroup2's favordynmods (issue 13), and
kernel.pid_max (sandbox_core/tasklimits.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from sandbox_core import cgroups, get_backend, tasklimits
from sandbox_core.backends.config import backend_config
from tests.conftest import require
from tests.farmkit import Farm, farm_db, make_farm  # noqa: F401


def test_a_local_backend_as_root_mounts_cgroup2_with_favordynmods() -> None:
    require(os.geteuid() == 0, "needs root to remount cgroup2")
    require(cgroups.cgroup2_mount() is not None, "no cgroup2 mount on this host")
    backend = get_backend(backend_config("process"))
    try:
        # favordynmods cannot be taken off again without a reboot, so the proof is the
        # mount's options after the backend started, and what doctor says of them
        assert cgroups.favors_dynmods() is True
        row = {p.name: p for p in backend.protections()}["fast_cgroup_attach"]
        assert row.active and "favordynmods" in row.detail
    finally:
        backend.close()
    doctor = subprocess.run(
        [sys.executable, "-m", "producer.cli", "doctor", "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    rows = {r["name"]: r for r in json.loads(doctor.stdout)["process"]}
    assert rows["fast_cgroup_attach"]["active"] is True


def test_the_opt_out_leaves_the_mount_alone(monkeypatch) -> None:
    require(os.geteuid() == 0, "the remount is only tried as root")
    called = []
    monkeypatch.setattr(cgroups, "favor_dynmods", lambda: called.append(1))
    get_backend(backend_config("process", favor_dynmods=False)).close()
    assert called == []
    get_backend(backend_config("process")).close()
    assert called == [1]


def test_a_worker_as_root_raises_the_hosts_pid_table_and_doctor_says_so(make_farm) -> None:  # noqa: F811
    """At pid_max 32,768 (a host booted without systemd's sysctl) eight jobs at the most
    processes fill the pid table, and no process on the host can fork (an attack review).
    A worker started as root raises it as Debian's systemd does; the opt-out leaves it."""
    require(os.geteuid() == 0, "needs root to write kernel.pid_max")
    before = tasklimits.pid_max()
    assert before is not None
    try:
        tasklimits.PID_MAX.write_text("32768")
        assert tasklimits.jobs_at_most_processes() == (32768 - 4096) // 4096  # 7: the hole
        farm: Farm = make_farm()
        keeps = farm.start_worker("keeps", 1, SANDFARM_RAISE_PID_MAX="false")
        keeps.stop()
        assert "kernel.pid_max" not in keeps.log.read_text()  # the opt-out leaves it
        tasklimits.PID_MAX.write_text("32768")  # (whatever else started meanwhile)
        raises = farm.start_worker("raises", 1)
        assert tasklimits.pid_max() == tasklimits.PID_MAX_TARGET
        assert "kernel.pid_max raised from 32768 to 4194304" in raises.log.read_text()
        doctor = subprocess.run(
            [sys.executable, "-m", "producer.cli", "doctor", "--json"],
            capture_output=True,
            text=True,
            check=True,
        )
        row = {r["name"]: r for r in json.loads(doctor.stdout)["farm"]}["host task tables"]
        assert row["active"] is True and "4194304" in row["detail"], row
    finally:
        tasklimits.PID_MAX.write_text(str(max(before, tasklimits.PID_MAX_TARGET)))

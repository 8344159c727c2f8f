"""Host settings the project applies itself: cgroup2's favordynmods (issue 13)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from sandbox_core import cgroups, get_backend
from sandbox_core.backends.config import backend_config
from tests.conftest import require


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

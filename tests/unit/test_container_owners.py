"""Who owns a sandbox container (sandbox_core.backends.docker.containers.owner_alive):
a zombie owner is a dead one. A killed worker's pool process reparented to a subreaper
that never waits (a test runner that ran a local backend in-process, a supervisor)
stays a zombie, and its container was kept as if the owner still ran."""

from __future__ import annotations

import os
import time

from sandbox_core.backends.docker.containers import owner_alive
from sandbox_core.procid import start_time


def test_zombie_owner_counts_as_dead() -> None:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    try:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # the child has exited, not been waited for
            with open(f"/proc/{pid}/stat") as stat:
                if stat.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
            time.sleep(0.01)
        else:
            raise AssertionError("the child never became a zombie")
        labels = {"sandfarm.pid": str(pid), "sandfarm.start": "1"}
        assert start_time(pid) == ""
        assert owner_alive(labels) is False
    finally:
        os.waitpid(pid, 0)


def test_live_owner_counts_as_alive() -> None:
    me = os.getpid()
    labels = {"sandfarm.pid": str(me), "sandfarm.start": start_time(me)}
    assert labels["sandfarm.start"]
    assert owner_alive(labels) is True

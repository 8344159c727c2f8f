"""A pool process killed while it pins a slot's network namespace leaves nothing holding
its slot: the forked helper that makes the namespace dies with it and never held the
parent's files (sandbox_core.childsetup.pinned_network_namespace). Before, the helper
stayed paused for ever with the slot's lock, and the pool process's replacement waited
30 s for the slot and failed the job it was redelivered (test_chain_faults)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sandbox_core.slots import try_flock

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="a network namespace needs root")

# Holds a lock as a slot's holder does, then pins a namespace and is SIGKILLed the moment
# the helper has made it (between the fork and the parent's own kill of the helper).
VICTIM = """
import fcntl, os, signal, sys
from sandbox_core import childsetup
lock = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(lock, fcntl.LOCK_EX)
real_read = os.read
def read(fd, n):
    data = real_read(fd, n)
    print("helper up" if data == b"1" else "helper failed", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
childsetup.os.read = read
childsetup.pinned_network_namespace()
"""


def test_killed_while_pinning_a_namespace_leaves_no_lock_holder(tmp_path: Path):
    lock = tmp_path / "slot.lock"
    proc = subprocess.run(
        [sys.executable, "-c", VICTIM, str(lock)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == -9, proc.stderr  # the attack ran: killed mid-pin
    assert proc.stdout == "helper up\n"  # after the helper had made the namespace
    deadline = time.monotonic() + 5
    fd = try_flock(lock)
    while fd is None and time.monotonic() < deadline:
        time.sleep(0.05)
        fd = try_flock(lock)
    assert fd is not None, "a process still holds the killed parent's lock"
    os.close(fd)

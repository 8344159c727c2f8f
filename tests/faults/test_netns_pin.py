"""A pool process killed while it makes a session's network namespace leaves nothing
holding its slot (sandbox_core.childsetup.new_network_namespace: a thread of its own
makes it, no process). Once, a forked helper made it and stayed paused for ever with the
slot's lock, and the pool process's replacement waited 30 s for the slot and failed the
job it was redelivered (test_chain_faults)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sandbox_core.slots import try_flock

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="a network namespace needs root")

# Holds a lock as a slot's holder does, then makes a namespace and is SIGKILLed the moment
# it is made (loopback up, before its fd is taken).
VICTIM = """
import fcntl, os, signal, sys
from sandbox_core import childsetup
lock = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(lock, fcntl.LOCK_EX)
real_up = childsetup.configure_loopback
def up():
    real_up()
    print("namespace up", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
childsetup.configure_loopback = up
childsetup.new_network_namespace()
"""


def test_killed_while_making_a_namespace_leaves_no_lock_holder(tmp_path: Path):
    lock = tmp_path / "slot.lock"
    proc = subprocess.run(
        [sys.executable, "-c", VICTIM, str(lock)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == -9, proc.stderr  # the fault happened: killed mid-make
    assert proc.stdout == "namespace up\n"  # after the namespace was made
    deadline = time.monotonic() + 5
    fd = try_flock(lock)
    while fd is None and time.monotonic() < deadline:
        time.sleep(0.05)
        fd = try_flock(lock)
    assert fd is not None, "a process still holds the killed parent's lock"
    os.close(fd)

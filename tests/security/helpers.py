"""Host-side checks: the attack failed and the host is intact."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path


def new_marker() -> str:
    return f"sandfarm-marker-{uuid.uuid4().hex[:12]}"


def pids_with_marker(marker: str) -> list[int]:
    """Host pids whose command line contains ``marker`` (sees every namespace)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            state = next(
                line
                for line in (entry / "status").read_text().splitlines()
                if line.startswith("State:")
            )
        except (OSError, StopIteration):
            continue
        if marker.encode() in cmdline and "zombie" not in state:
            found.append(int(entry.name))
    return found


def wait_gone(marker: str, timeout_s: float = 2.0) -> list[int]:
    """Pids still alive with ``marker`` after up to ``timeout_s`` (expected: none)."""
    deadline = time.monotonic() + timeout_s
    while (alive := pids_with_marker(marker)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive


def self_alive() -> bool:
    os.kill(os.getpid(), 0)
    return True

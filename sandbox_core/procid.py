"""Who a process is, in terms that mean the same anywhere on the host and across its
reboots: the boot, the pid namespace (a pid means nothing outside its namespace) and the
process's start time (pids are reused)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def boot_id() -> str:
    with contextlib.suppress(OSError):
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    return ""


def pid_namespace() -> str:
    with contextlib.suppress(OSError):
        return os.readlink("/proc/self/ns/pid")
    return ""


def start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat);
    "" when it is gone or a zombie (dead, its exit status not yet collected: a killed
    worker's pool process reparented to a subreaper that does not wait stays one)."""
    with contextlib.suppress(OSError, IndexError):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return "" if fields[0] in ("Z", "X") else fields[19]
    return ""


def identity(pid: int) -> str:
    """``pid``'s process as "boot pidns start" (see ``is_gone``)."""
    return f"{boot_id()} {pid_namespace()} {start_time(pid)}"


def is_gone(pid: int, identity_then: str) -> bool:
    """Is the process that was ``pid`` with ``identity_then`` surely gone? Another boot,
    or in this pid namespace no process under that pid with that start time. One of
    another pid namespace is not known gone: a worker in a container, started again in
    another, leaves its docker jobs' containers running, judged by its name (a review)."""
    boot, _, rest = identity_then.partition(" ")
    pidns, _, start = rest.rpartition(" ")
    if boot != boot_id():
        return True
    return pidns == pid_namespace() and start_time(pid) != start

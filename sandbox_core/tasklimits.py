"""The host's task tables: ``kernel.pid_max`` and ``kernel.threads-max``, one count each
for the whole host, every namespace and cgroup. A job may hold ``limits.processes``
tasks (at most defaults.PROCESSES[1], 4,096); at the kernel's 32-bit-era default
``pid_max`` of 32,768 eight such jobs at once fill the pid table, and no process on the
host can fork (an attack review held 4,095 threads in one docker job).

Debian's systemd raises ``pid_max`` to 4,194,304 at boot (/usr/lib/sysctl.d/
50-pid-max.conf); a host booted without it (a container's init, a VM's) keeps 32,768.
So a worker started as root raises it to that value where it is lower (host-wide; the
``raise_pid_max`` setting opts out), and ``doctor`` reports how many jobs at the most
processes the tables hold. ``threads-max`` follows the host's RAM and is left alone.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from sandbox_core import defaults as d

PID_MAX = Path("/proc/sys/kernel/pid_max")
THREADS_MAX = Path("/proc/sys/kernel/threads-max")
# systemd's value on 64-bit hosts, the kernel's PID_MAX_LIMIT there
PID_MAX_TARGET = 4_194_304
# tasks left for the host's own services whatever the jobs hold
HOST_TASK_RESERVE = 4096


def _read(path: Path) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        return int(path.read_text())
    return None


def pid_max() -> int | None:
    return _read(PID_MAX)


def task_room() -> int | None:
    """Tasks the host's tables hold for jobs: the lower of pid_max and threads-max, less
    HOST_TASK_RESERVE; None where they cannot be read."""
    values = [v for v in (_read(PID_MAX), _read(THREADS_MAX)) if v is not None]
    return max(0, min(values) - HOST_TASK_RESERVE) if values else None


def jobs_at_most_processes() -> int | None:
    """How many jobs at the most processes a job may ask for fit the tables at once."""
    room = task_room()
    return None if room is None else room // d.PROCESSES[1]


def raise_pid_max() -> str | None:
    """Raise pid_max to PID_MAX_TARGET where it is lower; what was done, or why not
    (None: nothing to do)."""
    current = _read(PID_MAX)
    if current is None:
        return f"left as it is: {PID_MAX} unreadable"
    if current >= PID_MAX_TARGET:
        return None
    if os.geteuid() != 0:
        return f"left at {current}: not root"
    try:
        PID_MAX.write_text(str(PID_MAX_TARGET))
    except OSError as exc:
        return f"left at {current}: {exc.strerror}"
    return f"raised from {current} to {PID_MAX_TARGET}"

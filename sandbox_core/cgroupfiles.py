"""A slot's cgroup files, opened once and re-read or re-written job after job.

Each step reads its group's CPU and OOM counters before and after, and kills and checks
the group after: five opens of kernfs files per job, tens of µs each on our 2-core VM (a
one-off cProfile), where a ``pread``/``pwrite`` on an open descriptor costs a few. A
slot's group lives as long as the slot holds it (``JobCgroup.remove`` closes them);
should its directory be made anew all the same, the old descriptor fails (ENODEV) and
the path is opened again, so a kill never goes to a group that is gone. The descriptors
are the worker's: close-on-exec, and a job's process is started with ``close_fds``.

Only files the kernel renders afresh on every read belong here: a cgroup v1
``cgroup.procs`` keeps the pid list of an open file for a second after its last read
(``JobCgroup.empty`` opens those anew). Below: the OOM counter's file and format (the
docker backend's host cgroup reads it too), the memory peak's file, v1's freezer kill.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

READ_MAX = 64 * 1024  # counters and "is anyone here": far below this
T = TypeVar("T")


class OpenFiles:
    def __init__(self) -> None:
        self._fds: dict[tuple[Path, int], int] = {}
        self._closed = False
        # Held across each read and write: a descriptor is never closed (and its number
        # reused) under a thread still using it.
        self._lock = threading.Lock()

    def read(self, path: Path, size: int = READ_MAX) -> bytes:
        """Up to ``size`` bytes of the file from its start (raises OSError)."""
        return self._on(path, os.O_RDONLY, lambda fd: os.pread(fd, size, 0))

    def write(self, path: Path, data: bytes) -> None:
        self._on(path, os.O_WRONLY, lambda fd: os.pwrite(fd, data, 0))

    def _on(self, path: Path, mode: int, op: Callable[[int], T]) -> T:
        key = (path, mode)
        with self._lock:
            if self._closed:
                raise OSError(errno.EBADF, "the group's files are closed", str(path))
            for attempt in (0, 1):
                fd = self._fds.get(key)
                if fd is None:
                    fd = os.open(path, mode | os.O_CLOEXEC)
                    self._fds[key] = fd
                try:
                    return op(fd)
                except OSError:
                    del self._fds[key]
                    os.close(fd)
                    if attempt:
                        raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        with self._lock:
            fds, self._fds, self._closed = list(self._fds.values()), {}, True
        for fd in fds:
            os.close(fd)


def oom_file(v2: bool) -> str:
    """The file of a memory cgroup that counts OOM kills (v2, or v1's oom_control)."""
    return "memory.events" if v2 else "memory.oom_control"


def read_oom_kills(path: Path) -> int:
    """The ``oom_kill`` counter of a memory.events / memory.oom_control file; 0 if absent."""
    with contextlib.suppress(OSError):
        return parse_oom_kills(path.read_text())
    return 0


def parse_oom_kills(text: str) -> int:
    with contextlib.suppress(ValueError):
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
    return 0


def peak_file(v2: bool) -> str:
    """The file of a memory cgroup holding the most it has used (a write resets it)."""
    return "memory.peak" if v2 else "memory.max_usage_in_bytes"


def freeze_and_kill(path: Path) -> None:
    """SIGKILL every process of a cgroup v1 freezer group: frozen tasks cannot fork, so
    one pass over cgroup.procs reaches them all."""
    state = path / "freezer.state"
    with contextlib.suppress(OSError):
        state.write_text("FROZEN")
        for pid in (path / "cgroup.procs").read_text().split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), 9)
        state.write_text("THAWED")  # SIGKILL is delivered once thawed

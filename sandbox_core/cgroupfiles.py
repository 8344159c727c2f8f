"""A slot's cgroup files, opened once and re-read or re-written job after job.

Each step reads its group's CPU and OOM counters before and after, and kills and checks
the group after: five opens of kernfs files per job, ~50 µs each on our 2-core VM, where
a ``pread``/``pwrite`` on an open descriptor costs a few. A slot's group lives as long
as the slot holds it (``JobCgroup.remove`` closes them); should its directory be made
anew all the same, the old descriptor fails (ENODEV) and the path is opened again, so a
kill never goes to a group that is gone. The descriptors are the worker's: close-on-exec,
and a job's process is started with ``close_fds``.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

READ_MAX = 64 * 1024  # counters and "is anyone here": far below this


class OpenFiles:
    def __init__(self) -> None:
        self._fds: dict[tuple[Path, int], int] = {}
        self._lock = threading.Lock()  # the prewarm thread and a job's share a slot

    def read(self, path: Path, size: int = READ_MAX) -> bytes:
        """Up to ``size`` bytes of the file from its start (raises OSError)."""
        try:
            return os.pread(self._fd(path, os.O_RDONLY), size, 0)
        except OSError:
            self._forget(path, os.O_RDONLY)
            return os.pread(self._fd(path, os.O_RDONLY), size, 0)

    def write(self, path: Path, data: bytes) -> None:
        try:
            os.pwrite(self._fd(path, os.O_WRONLY), data, 0)
        except OSError:
            self._forget(path, os.O_WRONLY)
            os.pwrite(self._fd(path, os.O_WRONLY), data, 0)

    def _fd(self, path: Path, mode: int) -> int:
        with self._lock:
            fd = self._fds.get((path, mode))
            if fd is None:
                fd = os.open(path, mode | os.O_CLOEXEC)
                self._fds[(path, mode)] = fd
            return fd

    def _forget(self, path: Path, mode: int) -> None:
        # One user at a time per slot group (the slot's job, or the prewarm thread once
        # the job has given it back): closing cannot pull a descriptor from under another.
        with self._lock:
            fd = self._fds.pop((path, mode), None)
        if fd is not None:
            os.close(fd)

    def close(self) -> None:
        with self._lock:
            fds, self._fds = list(self._fds.values()), {}
        for fd in fds:
            os.close(fd)

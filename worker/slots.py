"""Sandbox slot ⇄ pool process ⇄ unprivileged uid.

A worker reserves a block of ``concurrency`` consecutive slots on its host (from the
top of the range down) when it starts, before the pool forks, so two workers on one
host never share a slot. Pool process ``i`` (billiard gives a replacement child the
index of the one it replaces) always runs its jobs in slot ``base + i``, hence as uid
``SLOT_UID_BASE + base + i``.

The reservation is an flock per slot, separate from the per-job slot lock in
sandbox_core.slots: it is held by the worker's main process and inherited by its pool
children, so it ends when the last of them dies.
"""

from __future__ import annotations

import fcntl
import os
from dataclasses import dataclass, field

from sandbox_core import defaults as d
from sandbox_core.slots import state_dir


@dataclass
class Reservation:
    base: int
    size: int
    _fds: list[int] = field(default_factory=list)

    @property
    def indices(self) -> range:
        return range(self.base, self.base + self.size)

    def release(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds.clear()


def _reserve_dir():
    path = state_dir() / "reserved"
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path


def _try(index: int) -> int | None:
    fd = os.open(_reserve_dir() / f"{index}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return fd
    except BlockingIOError:
        os.close(fd)
        return None


def reserve(size: int, base: int | None = None) -> Reservation:
    """Reserve ``size`` consecutive slots: at ``base``, or the highest free block.

    From the top down because local users of sandbox_core (`sandfarm run`, tests) take
    the first free slot from 0 up: the two meet only on a host with nearly every slot busy.
    """
    if size < 1 or size > d.MAX_SLOTS:
        raise ValueError(f"concurrency must be 1..{d.MAX_SLOTS}")
    starts = [base] if base is not None else range(d.MAX_SLOTS - size, -1, -1)
    for start in starts:
        if start + size > d.MAX_SLOTS:
            break
        fds: list[int] = []
        for index in range(start, start + size):
            fd = _try(index)
            if fd is None:
                break
            fds.append(fd)
        if len(fds) == size:
            return Reservation(start, size, fds)
        for fd in fds:
            os.close(fd)
    where = f"at {base}" if base is not None else "anywhere"
    raise RuntimeError(f"no block of {size} free sandbox slots {where} on this host")


def is_reserved(index: int) -> bool:
    fd = _try(index)
    if fd is None:
        return True
    os.close(fd)
    return False


def slot_uid(index: int) -> int | None:
    return d.SLOT_UID_BASE + index if os.geteuid() == 0 else None

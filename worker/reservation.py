"""A worker's block of sandbox slots on its host: slot ⇄ pool process ⇄ unprivileged uid.

A worker reserves a block of ``concurrency`` consecutive slots on its host (from the
top of the range down) when it starts, before the pool forks, so two workers on one
host never share a slot. Pool process ``i`` (billiard gives a replacement child the
index of the one it replaces) always runs its jobs in slot ``base + i``, hence as uid
``sandbox_core.slots.slot_uid(base + i)``.

The reservation is an flock per slot, separate from the per-job slot lock in
sandbox_core.slots: it is held by the worker's main process and inherited by its pool
children, so it ends when the last of them dies.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from producer.protocol import SlotReservationError
from sandbox_core import defaults as d
from sandbox_core.slots import state_dir, try_flock


@dataclass
class Reservation:
    base: int
    size: int
    _fds: list[int] = field(default_factory=list)
    processes: int = 0  # pool processes the block is for (each has size // processes)

    @property
    def end(self) -> int:
        return self.base + self.size

    def release(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds.clear()


def _try(index: int) -> int | None:
    return try_flock(state_dir() / "reserved" / f"{index}.lock")


def reserve(size: int, base: int | None = None, processes: int | None = None) -> Reservation:
    """Reserve ``size`` consecutive slots: at ``base``, or the highest free block.

    From the top down because local users of sandbox_core (`sandfarm run`, tests) take
    the first free slot from 0 up: the two meet only on a host with nearly every slot busy.
    """
    if size < 1 or size > d.MAX_SLOTS:
        raise SlotReservationError(size, f"(concurrency must be 1..{d.MAX_SLOTS})")
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
            return Reservation(start, size, fds, processes or size)
        for fd in fds:
            os.close(fd)
    raise SlotReservationError(size, f"at {base}" if base is not None else "anywhere")

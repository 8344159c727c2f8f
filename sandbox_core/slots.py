"""Sandbox slots: one job at a time per slot, each slot with its own unprivileged uid.

A slot is held with an flock, so two processes (two pool children, or a test and a
worker) never run jobs in the same slot; the lock dies with its holder. Taking a slot
first sweeps whatever a dead previous holder left behind in it.
"""

from __future__ import annotations

import contextlib
import fcntl
import grp
import os
import pwd
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from sandbox_core import cgroups
from sandbox_core import defaults as d
from sandbox_core.cgroups import JobCgroup
from sandbox_core.childsetup import new_network_namespace
from sandbox_core.errors import SlotBusyError
from sandbox_core.sweep import sweep_uid
from sandbox_core.workspace import unmount


def slot_uid(index: int) -> int | None:
    """The uid (and gid) slot ``index`` runs its jobs as; None when not root (jobs then
    run as the caller)."""
    return d.SLOT_UID_BASE + index if os.geteuid() == 0 else None


def slot_of_uid(uid: int) -> int | None:
    """The slot whose jobs run as ``uid``, or None for a uid outside the slot range."""
    index = uid - d.SLOT_UID_BASE
    return index if 0 <= index < d.MAX_SLOTS else None


@cache
def uid_range_problem() -> str | None:
    """Why the slot uids (the host backends' and Docker's, and the Docker keeper's) cannot
    be used here, or None: none of them may be a host account, whose other processes
    would share the job's per-uid kernel limits and could ptrace it."""
    for uid in range(d.KEEPER_UID, d.DOCKER_UID_BASE + d.MAX_SLOTS):
        with contextlib.suppress(KeyError):
            return f"uid {uid} is the host account {pwd.getpwuid(uid).pw_name!r}"
        with contextlib.suppress(KeyError):
            return f"gid {uid} is the host group {grp.getgrgid(uid).gr_name!r}"
    return None


def state_dir() -> Path:
    if os.geteuid() == 0:
        return Path("/run/sandfarm")
    return Path(tempfile.gettempdir()) / f"sandfarm-{os.geteuid()}"


def try_flock(path: Path, blocking: bool = False) -> int | None:
    """An fd holding an exclusive flock on ``path`` (created 0600), or None if another
    open file holds it. The lock ends when the fd is closed or its holder dies."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        return fd
    except BlockingIOError:
        os.close(fd)
        return None


def workspace_base(configured: Path | None = None) -> Path:
    """Where slot workspaces live. Not under /run: the process backend hides /run (local
    services' sockets) from jobs."""
    if configured is not None:
        return configured
    if os.geteuid() == 0:
        return Path("/var/lib/sandfarm/work")
    return state_dir() / "work"


@dataclass
class Slot:
    index: int
    uid: int | None  # None: not root, jobs run as the caller
    gid: int | None
    _lock_fd: int | None = None
    cgroup: JobCgroup | None = None  # reused job after job; emptied after each
    _netns_fd: int | None = None

    @property
    def cgroup_name(self) -> str:
        return f"slot{self.index}"

    def network_namespace(self) -> int:
        """The current session's loopback-only network namespace (root only), made on
        first use after the slot's last session ended: no two jobs share one."""
        if self._netns_fd is None:
            self._netns_fd = new_network_namespace()
        return self._netns_fd

    def end_session(self) -> None:
        """The session in this slot is over: its network namespace goes with it (why:
        childsetup.new_network_namespace)."""
        if self._netns_fd is not None:
            os.close(self._netns_fd)  # the kernel frees it once no process is in it
            self._netns_fd = None

    def workspace_dir(self, base: Path | None = None) -> Path:
        """This slot's directory of job workspaces under ``base`` (see workspace_base)."""
        return workspace_base(base) / f"slot-{self.index}"

    def release(self) -> None:
        if self.cgroup is not None:
            self.cgroup.kill()
            self.cgroup.remove()
            self.cgroup = None
        self.end_session()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None


def acquire(
    index: int | None = None, timeout_s: float = 30.0, workspace_dir: Path | None = None
) -> Slot:
    """Hold slot ``index`` (or the first free one), after sweeping its leftovers."""
    deadline = time.monotonic() + timeout_s
    while True:
        candidates = [index] if index is not None else range(d.MAX_SLOTS)
        for i in candidates:
            fd = try_flock(state_dir() / "slots" / f"{i}.lock")
            if fd is not None:
                uid = slot_uid(i)
                slot = Slot(i, uid, uid, fd)
                try:
                    sweep(slot, workspace_dir)
                    if uid is not None and cgroups.detect().can_kill_tree:
                        slot.cgroup = JobCgroup.create(slot.cgroup_name, d.MIB * 64, 64)
                except BaseException:
                    slot.release()
                    raise
                return slot
        if time.monotonic() > deadline:
            raise SlotBusyError(index, timeout_s)
        time.sleep(0.05)


def sweep(slot: Slot, workspace_dir: Path | None = None) -> None:
    """Remove what a previous holder of this slot left: processes, cgroups, workspaces."""
    if slot.uid is not None:
        cgroups.remove_stale(slot.cgroup_name)  # the group first: kills even setsid'd trees
        sweep_uid(slot.uid)
    base = slot.workspace_dir(workspace_dir)
    if base.is_dir():
        for leftover in base.iterdir():
            unmount(str(leftover))
            with contextlib.suppress(OSError):
                shutil.rmtree(leftover)


class SlotPool:
    """The slots one backend runs its sessions in.

    With fixed ``lanes`` (a worker's pool process: its slot, and a spare where it has
    one) every backend of this process shares those slots, one session in a slot at a
    time whatever its backend, so a worker serving several backends never waits on
    itself; with a spare, the next job's sandbox is set up in one slot while a job runs
    in the other (prewarm). Without lanes (``sandfarm run``, tests) each concurrent
    session takes a free slot of its own.
    """

    def __init__(self, lanes: tuple[int, ...] | int | None, workspace_dir: Path | None) -> None:
        if isinstance(lanes, int):
            lanes = (lanes,)
        self.lanes: tuple[int, ...] = tuple(lanes or ())
        self.workspace_dir = workspace_dir
        self._idle: list[Slot] = []
        self._lock = threading.Lock()
        self._closed = False
        if self.lanes:
            _share_lanes(self.lanes)

    @property
    def index(self) -> int | None:
        """The first fixed slot (a docker session's, a standby's key), or None."""
        return self.lanes[0] if self.lanes else None

    @contextlib.contextmanager
    def borrow(self) -> Iterator[Slot]:
        """A slot for one session (see take), given back after it."""
        slot = self.take()
        try:
            yield slot
        finally:
            self.give(slot)

    def take(self, timeout_s: float = 30.0) -> Slot:
        """A slot: a free one of the fixed lanes (waiting up to ``timeout_s`` for one),
        one this pool holds idle (cleaned by the last session's close), or a newly locked
        one (swept of what its last holder left). ``give`` it back."""
        if self.lanes:
            return _take_lane(self.lanes, self.workspace_dir, timeout_s)
        with self._lock:
            slot = self._idle.pop() if self._idle else None
        return slot or acquire(None, timeout_s, workspace_dir=self.workspace_dir)

    def give(self, slot: Slot) -> None:
        """``slot`` is free again: nothing of its last session is left in it."""
        if self.lanes:
            _give_lane(slot)
            return
        with self._lock:
            self._idle.append(slot)

    def close(self) -> None:
        """Give back the slots this pool holds (a shared one when its last user is gone)."""
        with self._lock:
            if self.lanes and not self._closed:
                _unshare_lanes(self.lanes)
            self._closed = True
            held, self._idle = self._idle, []
        for slot in held:
            slot.release()


# The fixed slots this process's backends share: index -> [the slot once locked, how many
# pools use it], and those a session (or a standby, or a teardown) is in now.
_held: dict[int, list[Any]] = {}
_in_use: set[int] = set()
_held_cond = threading.Condition()


def _share_lanes(lanes: tuple[int, ...]) -> None:
    with _held_cond:
        for index in lanes:
            _held.setdefault(index, [None, 0])[1] += 1


def _take_lane(lanes: tuple[int, ...], workspace_dir: Path | None, timeout_s: float) -> Slot:
    deadline = time.monotonic() + timeout_s
    with _held_cond:
        while True:
            free = [i for i in lanes if i not in _in_use]
            if free:
                entry = _held.setdefault(free[0], [None, 1])
                if entry[0] is None:
                    entry[0] = acquire(free[0], workspace_dir=workspace_dir)
                _in_use.add(free[0])
                slot: Slot = entry[0]
                return slot
            left = deadline - time.monotonic()
            if left <= 0:
                raise SlotBusyError(lanes[0], timeout_s)
            _held_cond.wait(left)


def _give_lane(slot: Slot) -> None:
    with _held_cond:
        _in_use.discard(slot.index)
        _held_cond.notify_all()


def _unshare_lanes(lanes: tuple[int, ...]) -> None:
    """One pool fewer uses each of ``lanes``; the last one releases the slot."""
    released = []
    with _held_cond:
        for index in lanes:
            entry = _held.get(index)
            if entry is None:
                continue
            entry[1] -= 1
            if entry[1] <= 0:
                del _held[index]
                _in_use.discard(index)
                if entry[0] is not None:
                    released.append(entry[0])
    for slot in released:
        slot.release()

"""The parent's side of a sandbox: finding, killing and reaping what a job left running.

Everything here runs in the worker (as root where slots have their own uids), by pid:
nothing a job runs can signal, stop or outwait the sweeper.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import time
from collections.abc import Callable, Iterable

from sandbox_core.defaults import SOCKET_DRAIN_S
from sandbox_core.sockdiag import end_sockets_of

log = logging.getLogger(__name__)

_libc = ctypes.CDLL(None, use_errno=True)
_PR_SET_CHILD_SUBREAPER = 36


def become_subreaper(enabled: bool = True) -> None:
    """Orphans of our jobs become our children, so we reap them at once; left to pid 1
    (slow or absent in containers) their zombies count against the slot's process caps.
    ``enabled=False`` gives them back to pid 1 (a process that will not reap them)."""
    _libc.prctl(_PR_SET_CHILD_SUBREAPER, int(enabled), 0, 0, 0)


def reap_zombies_of(uid: int, limit: int = 100_000) -> int:
    """Reap our exited children that ran as ``uid`` (orphans of a job come to us as its
    subreaper): left as zombies they would count against the slot's process limit.

    Children of other uids (another slot's job, run by another thread) are left alone:
    their own runner waits for them."""
    reaped = 0
    while reaped < limit:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return reaped
        if info is None:
            return reaped
        if info.si_uid != uid:  # another slot's child is first in line: find ours by pid
            return reaped + _reap_by_pid(uid)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(info.si_pid, 0)
        reaped += 1
    return reaped


def _reap_by_pid(uid: int) -> int:
    me, reaped = os.getpid(), 0
    for pid in _zombie_children(me):
        if process_uids_of([pid]).get(pid) == uid:
            with contextlib.suppress(ChildProcessError):
                if os.waitpid(pid, os.WNOHANG)[0]:
                    reaped += 1
    return reaped


def _zombie_children(parent: int) -> list[int]:
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] == b"Z" and int(fields[1]) == parent:
            found.append(int(entry.name))
    return found


def process_uids() -> dict[int, int]:
    """pid -> real uid of every live process."""
    return process_uids_of(int(e.name) for e in os.scandir("/proc") if e.name.isdigit())


def process_uids_of(pids: Iterable[int]) -> dict[int, int]:
    """pid -> real uid, from /proc/PID/status (the owner of /proc/PID itself is root while
    a process is not dumpable); pids that are gone are left out."""
    found: dict[int, int] = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status", "rb") as fh:
                for line in fh:
                    if line.startswith(b"Uid:"):
                        found[pid] = int(line.split()[1])
                        break
        except (OSError, ValueError, IndexError):
            continue
    return found


def pids_of_uid(uid: int) -> list[int]:
    """Live processes whose real uid is ``uid``."""
    return [pid for pid, owner in process_uids().items() if owner == uid]


def kill_until_gone(
    find: Callable[[], list[int]], rounds: int = 50, after: Callable[[], object] | None = None
) -> bool:
    """SIGKILL whatever ``find`` lists until it lists nothing; True when none is left.

    A fork bomb races the sweep; the job's process cap bounds the race, ``rounds`` the
    time. ``after`` runs after each round (reaping zombies that would otherwise stay).
    From the second round it pauses, 2 ms doubling to 50 ms: a killed process is listed
    until it has finished exiting, which on a loaded host outlasted 50 rounds back to
    back (~2.3 s of pauses at most, only while something is left).
    """
    for round_ in range(rounds):
        pids = find()
        if not pids:
            return True
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if after is not None:
            after()
        if 0 < round_ < rounds - 1:
            time.sleep(min(0.001 * 2**round_, 0.05))
    return not find()


def sweep_uid(uid: int, rounds: int = 50) -> bool:
    """Kill every process running as ``uid`` (a slot uid); True when none is left."""
    return kill_until_gone(lambda: pids_of_uid(uid), rounds, lambda: reap_zombies_of(uid))


def end_sockets(uid: int, deadline: float) -> None:
    """End the TCP and UDP sockets of ``uid`` that outlive its processes, in the
    calling thread's namespace: the host's, which a network job on L1/L2 shares. One it
    closed while still sending (an orphan) stays charged to the slot's group, against
    the slot's next job; one held by another process keeps doing what it did (passed
    to another job, a listener held ~207 MB counted for neither, an attack review; no
    job can take one now, landlock.py, so this is the second line). Those still
    sending go on for up to SOCKET_DRAIN_S first, not past ``deadline`` (the job's,
    ``time.monotonic``): the data a program sent as it exited reaches its peer. A
    failure is the farm's: logged, the job's result stands."""
    try:
        end_sockets_of(uid, drain_until=min(time.monotonic() + SOCKET_DRAIN_S, deadline))
    except OSError as exc:
        log.warning("the sockets of uid %d outlive its job: %s", uid, exc)

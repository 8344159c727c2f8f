"""TCP memory a job holds past its bound, which only watching can stop (``TcpWatch``).

Cgroup v1 bounds a job's socket buffers by its TCP limit (defaults.TCP_BUFFERS_BYTES),
but the kernel charges two kinds past any limit (attack reviews, 2026-12-05):

- **Connections waiting to be accepted** are charged to no cgroup: only the host's one
  ``tcp_mem`` pool counts them. A job that listens with the largest receive buffer the
  host allows (``SO_RCVBUF``: twice ``rmem_max``), connects to itself, fills each
  connection, resets its own end and never accepts, held ~1.6 GB from one default job on
  every backend. At ``tcp_mem``'s hard limit every TCP connection on the host stalls.
- **A connection accepted after it filled** is charged at ``accept()`` whatever the
  limit (a forced charge): the same job accepting each one as it fills held ~1.6 GB,
  all of it charged to its own 64 MiB bound.

No count the kernel keeps bounds them: a namespace's ``somaxconn`` bounds one listener,
not how many; conntrack forgets a reset connection, whose data the kernel still holds.
So each step is watched, every ``defaults.TCP_WATCH_S``, its leftovers' last moments
too:

- its TCP charge (v1's ``memory.kmem.tcp.usage_in_bytes``, one read) past its bound by
  more than ``defaults.TCP_OVERSHOOT_BYTES`` stops it;
- so do connections waiting in its uid's listeners that could hold more than
  ``defaults.WAITING_CONNECTIONS_BYTES``: each listener's queue length (sockdiag.py,
  ~0.17 ms a check) times the most one can hold, the largest receive buffer its listener
  could have had (a job can shrink it once they have come; the syscall filter refuses
  SO_RCVLOWAT, which raised it to tcp_rmem[2]); and more than ``_MOST_LISTENERS``
  listeners, too many to read.

Each figure is the job's own: another tenant's jobs never make it stop (but for network
jobs on L1/L2, which share the host's namespace: see TcpWatch._waiting).
"""

from __future__ import annotations

import errno
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from sandbox_core import defaults as d
from sandbox_core.childsetup import in_own_thread, join_network_namespace
from sandbox_core.sockdiag import Listener, listeners

log = logging.getLogger(__name__)
# What a waiting connection may hold past its receive buffer: the packet the kernel
# queues past any bound (loopback's usual 64 KiB; a network job's interface may be any).
_PACKET_SLACK_BYTES = 64 * d.KIB
# Listeners read at most, a check: a dump resumes at a hash bucket's start, so 15,500
# listeners on one port took 65 ms to read here, the first 1,024 4 ms.
_MOST_LISTENERS = 1024

Found = tuple[list[Listener], bool]  # the listeners read, and whether that was all
Listeners = Callable[[], Found]
Usage = Callable[[], int | None]


_RMEM_MAX = Path("/proc/sys/net/core/rmem_max")
_most_seen = 0  # most_one_connection_holds: the largest this process has seen


def most_one_connection_holds() -> int:
    """What one waiting connection may hold (read at each check, the largest this
    process has seen kept: a raised ``rmem_max`` counts at once, and a lowered one
    leaves the buffers made before it, a review): the largest receive buffer a listener
    could have had when it came, twice ``rmem_max`` (which a job's namespace copies from
    the host's), and a packet. Not the listener's buffer now: a
    job can shrink it once its connections have come (a review). Nothing else a job may
    do raises it past that: SO_RCVBUFFORCE needs CAP_NET_ADMIN, and seccomp refuses
    SO_RCVLOWAT (policy.py), which grew it to tcp_rmem[2]."""
    global _most_seen
    rmem_max = int(_RMEM_MAX.read_text())
    _most_seen = max(_most_seen, 2 * rmem_max + _PACKET_SLACK_BYTES)
    return _most_seen


def waiting_bytes(found: list[Listener], uid: int) -> tuple[int, int]:
    """(connections, bytes they could hold) waiting in ``uid``'s listeners."""
    mine = [listener for listener in found if listener.uid == uid]
    waiting = sum(listener.waiting for listener in mine)
    worst = most_one_connection_holds()
    most = sum(one.waiting * max(worst, one.receive_buffer + _PACKET_SLACK_BYTES) for one in mine)
    return waiting, most


def listeners_in_namespace(netns_fd: int) -> Found:
    """The listeners of the network namespace ``netns_fd`` (or of the process a pidfd
    names), read from a thread of our own that joins it and ends: no other thread of
    ours is ever in it."""

    def read() -> Found:
        join_network_namespace(netns_fd)
        return listeners(_MOST_LISTENERS)

    return in_own_thread(read)


def listeners_of_process(pid: int, cgroup_names: str) -> Found:
    """The listeners of ``pid``'s network namespace, through a pidfd of it whose cgroup
    names ``cgroup_names`` (a container's id): a pid reused since it was listed is never
    joined. OSError once it is gone, or is not that container's."""
    pidfd = os.pidfd_open(pid)
    try:
        with open(f"/proc/{pid}/cgroup") as groups:
            if cgroup_names not in groups.read():
                raise OSError(errno.ESRCH, f"pid {pid} is not in {cgroup_names[:12]}")
        return listeners_in_namespace(pidfd)  # setns takes a pidfd
    finally:
        os.close(pidfd)


def listeners_here() -> Found:
    """The listeners of this process's own namespace: a network job on L1/L2 shares the
    host's, and its uid tells its listeners from everyone else's."""
    return listeners(_MOST_LISTENERS)


class TcpWatch:
    """Called at each wake of a step's supervision: why the step must stop, or None."""

    def __init__(
        self,
        uid: int | None,
        found: Listeners | None,
        usage: Usage,
        bound_bytes: int,
        own_namespace: bool = True,
        every_s: float = d.TCP_WATCH_S,
    ) -> None:
        self.uid = uid  # None: waiting connections are not watched (not ours to read)
        self.found = found
        self.usage = usage
        self.bound_bytes = bound_bytes
        self.own_namespace = own_namespace  # False: the host's, where others listen too
        self.every_s = every_s
        self.next_check = time.monotonic() + every_s  # a short step is never read

    def __call__(self) -> str | None:
        now = time.monotonic()
        if now < self.next_check:
            return None
        self.next_check = now + self.every_s
        return self._charged() or self._waiting()

    def _charged(self) -> str | None:
        used = self.usage()
        if used is None or used <= self.bound_bytes + d.TCP_OVERSHOOT_BYTES:
            return None
        return (
            f"its TCP buffers reached {used // d.MIB} MB, past its bound of"
            f" {self.bound_bytes // d.MIB} MB (the kernel charges a connection accepted"
            " after it filled past any limit)"
        )

    def _waiting(self) -> str | None:
        if self.uid is None or self.found is None:
            return None
        try:
            found, complete = self.found()
        except OSError as exc:  # no sock_diag here: the farm's to fix, not the job's
            log.warning("TCP watch: listeners unreadable, not watched: %s", exc)
            self.found = None
            return None
        if not complete and (self.own_namespace or any(one.uid == self.uid for one in found)):
            # in the host's namespace, only if some are its own: it may be the one
            return f"it had more than {_MOST_LISTENERS} listening TCP sockets"
        waiting, most = waiting_bytes(found, self.uid)
        if most <= d.WAITING_CONNECTIONS_BYTES:
            return None
        return (
            f"the {waiting} connections waiting in its listeners, which the kernel charges"
            f" to no job until accepted, could hold {most // d.MIB} MB, more than the"
            f" {d.WAITING_CONNECTIONS_BYTES // d.MIB} MB allowed"
        )

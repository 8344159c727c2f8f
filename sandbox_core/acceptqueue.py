"""Connections waiting in a job's listeners: the TCP memory no cgroup is charged for.

The kernel charges a connection's buffers to a memory cgroup only once ``accept()``
takes it; until then they count only in the host's one ``tcp_mem`` pool. A job that
listens, connects to itself, fills each connection (up to twice ``rmem_max`` with
``SO_RCVBUF`` on the listener: 8 MiB on this VM image) and never accepts, held ~1.6 GB of
it from one default job on every backend, while its own TCP bound is 64 MiB (an attack
review, 2026-12-05): two such jobs pass the hard limit, and every TCP connection on the
host stalls, the workers' Redis traffic among them. The kernel has no bound for them
that a job cannot evade: a namespace's ``somaxconn`` bounds one listener, not how many;
conntrack forgets a connection once its peer resets it, though the kernel still holds
its data until the listener closes.

So each step is watched (``AcceptQueueWatch``): while the host's TCP memory is above the
kernel's own pressure-free mark (``tcp_mem[0]``), a job whose listeners hold connections
that could together hold more than ``defaults.WAITING_CONNECTIONS_BYTES`` is stopped.
A listener's row in ``/proc/net/tcp`` counts every connection in its accept queue, reset
ones too, and its uid is the job's. Reading the host's TCP memory costs one read of
``/proc/net/sockstat`` every ``defaults.ACCEPT_QUEUE_WATCH_S``; the job's tables are read
only while it is high.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from pathlib import Path

from sandbox_core import defaults as d
from sandbox_core.childsetup import in_own_thread, join_network_namespace

_LISTEN = "0A"  # a socket's state in /proc/net/tcp{,6}
_TABLES = ("tcp", "tcp6")
# What one waiting connection may hold past its receive buffer: the packet the kernel
# queues past any bound (loopback's usual 64 KiB; a network job's interface may be any).
_PACKET_SLACK_BYTES = 64 * d.KIB

Rows = Callable[[], list[str]]


def host_tcp_pages() -> int:
    """The host's TCP buffer memory in pages (every network namespace's, as tcp_mem)."""
    for line in Path("/proc/net/sockstat").read_text().splitlines():
        if line.startswith("TCP:"):
            fields = line.split()
            return int(fields[fields.index("mem") + 1])
    return 0


def _sysctl_ints(name: str) -> list[int]:
    return [int(v) for v in Path("/proc/sys", name).read_text().split()]


@functools.cache
def pressure_free_pages() -> int | None:
    """``tcp_mem[0]``: below it the kernel puts no pressure on any socket's buffers
    (read once a process). None where it cannot be read: a worker in a network namespace
    of its own (a container) does not see it, and its jobs go unwatched."""
    try:
        return _sysctl_ints("net/ipv4/tcp_mem")[0]
    except OSError:
        return None


@functools.cache
def most_one_connection_holds() -> int:
    """The bytes one connection waiting to be accepted can hold at most (read once a
    process): its listener's receive buffer (``SO_RCVBUF`` gives up to twice
    ``rmem_max``, which a job's namespace copies from the host's) and a packet."""
    largest = max(2 * _sysctl_ints("net/core/rmem_max")[0], _sysctl_ints("net/ipv4/tcp_rmem")[1])
    return largest + _PACKET_SLACK_BYTES


def waiting_connections(rows: list[str], uid: int) -> int:
    """Connections in the accept queues of ``uid``'s listeners, in ``rows`` of
    /proc/net/tcp or tcp6 (a listener's rx_queue is its accept queue's length)."""
    count = 0
    for row in rows:
        fields = row.split()
        if len(fields) > 7 and fields[3] == _LISTEN and fields[7] == str(uid):
            count += int(fields[4].partition(":")[2], 16)
    return count


def listener_rows(net_dir: str) -> list[str]:
    """The listeners' rows of ``net_dir``/tcp and tcp6. The kernel lists every listener
    before any other socket, so reading stops at the first other one: a job's thousands
    of connections cost the worker nothing to skip."""
    rows: list[str] = []
    for name in _TABLES:
        with open(f"{net_dir}/{name}") as table:
            next(table, None)  # the header
            for row in table:
                fields = row.split(maxsplit=4)
                if len(fields) < 4 or fields[3] != _LISTEN:
                    break
                rows.append(row)
    return rows


def rows_in_namespace(netns_fd: int) -> list[str]:
    """Listener rows of the network namespace ``netns_fd`` (read from a thread of our
    own that joins it and ends: no other thread of ours is ever in it)."""

    def read() -> list[str]:
        join_network_namespace(netns_fd)
        return listener_rows("/proc/thread-self/net")

    return in_own_thread(read)


def rows_of_process(pid: int) -> list[str] | None:
    """Listener rows of the network namespace ``pid`` is in (None once it is gone)."""
    try:
        return listener_rows(f"/proc/{pid}/net")
    except (FileNotFoundError, ProcessLookupError):
        return None


def rows_here() -> list[str]:
    """Listener rows of this process's own namespace (a network job on L1/L2 shares the
    host's: its uid tells its listeners from everyone else's)."""
    return listener_rows("/proc/self/net")


class AcceptQueueWatch:
    """Called at each wake of a step's supervision: True once the step must stop."""

    def __init__(self, uid: int, rows: Rows, every_s: float = d.ACCEPT_QUEUE_WATCH_S):
        self.uid = uid
        self.rows = rows
        self.every_s = every_s
        self.next_check = time.monotonic() + every_s  # a short step is never read
        self.waiting = 0  # connections its listeners held when it was stopped

    def __call__(self) -> bool:
        now = time.monotonic()
        if now < self.next_check:
            return False
        self.next_check = now + self.every_s
        mark = pressure_free_pages()
        if mark is None or host_tcp_pages() <= mark:
            return False
        self.waiting = waiting_connections(self.rows(), self.uid)
        return self.waiting * most_one_connection_holds() > d.WAITING_CONNECTIONS_BYTES

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
So each step is watched, every ``defaults.TCP_WATCH_S``:

- its TCP charge (v1's ``memory.kmem.tcp.usage_in_bytes``, one read) past its bound by
  more than ``defaults.TCP_OVERSHOOT_BYTES`` stops it;
- while the host's TCP memory is above the kernel's pressure-free mark (``tcp_mem[0]``),
  so are connections waiting in its uid's listeners that could together hold more than
  ``defaults.WAITING_CONNECTIONS_BYTES``: a listener's row in ``/proc/net/tcp`` counts
  its accept queue, reset connections included. The tables are read only then, and
  only so far: more listeners than that stop the job too.
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
# Listener rows read at most, a table: the kernel walks a table's bucket from its start
# again at each ~4 KiB read, so many listeners on one port cost the worker quadratic time
# (a review: 200 ms a check with 15,500; 8,000 took 34 ms here, the first 1,024 1.2 ms).
_MAX_LISTENER_ROWS = 1024

Rows = Callable[[], list[str] | None]  # None: too many listeners to read
Usage = Callable[[], int | None]


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
    of its own does not see it, and its jobs' waiting connections go unwatched."""
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


def listener_rows(net_dir: str) -> list[str] | None:
    """The listeners' rows of ``net_dir``/tcp and tcp6, or None if either holds more than
    ``_MAX_LISTENER_ROWS``. The kernel lists every listener before any other socket, so
    a job's connections after them are never read."""
    rows: list[str] = []
    for name in _TABLES:
        with open(f"{net_dir}/{name}", encoding="ascii", errors="replace") as table:
            next(table, None)  # the header
            for count, row in enumerate(table):
                fields = row.split(maxsplit=4)
                if len(fields) < 4 or fields[3] != _LISTEN:
                    break
                if count == _MAX_LISTENER_ROWS:
                    return None
                rows.append(row)
    return rows


def rows_in_namespace(netns_fd: int) -> list[str] | None:
    """Listener rows of the network namespace ``netns_fd`` (read from a thread of our
    own that joins it and ends: no other thread of ours is ever in it)."""

    def read() -> list[str] | None:
        join_network_namespace(netns_fd)
        return listener_rows("/proc/thread-self/net")

    return in_own_thread(read)


def rows_of_process(pid: int) -> list[str] | None:
    """Listener rows of the network namespace ``pid`` is in (raises OSError once the
    process is gone)."""
    return listener_rows(f"/proc/{pid}/net")


def rows_here() -> list[str] | None:
    """Listener rows of this process's own namespace (a network job on L1/L2 shares the
    host's: its uid tells its listeners from everyone else's)."""
    return listener_rows("/proc/self/net")


class TcpWatch:
    """Called at each wake of a step's supervision: why the step must stop, or None."""

    def __init__(
        self,
        uid: int | None,
        rows: Rows | None,
        usage: Usage,
        bound_bytes: int,
        every_s: float = d.TCP_WATCH_S,
    ) -> None:
        self.uid = uid  # None: waiting connections are not watched (not ours to read)
        self.rows = rows
        self.usage = usage
        self.bound_bytes = bound_bytes
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
        mark = pressure_free_pages()
        if self.uid is None or self.rows is None or mark is None or host_tcp_pages() <= mark:
            return None
        short = "stopped while the host's TCP memory was short:"
        rows = self.rows()
        if rows is None:
            return f"{short} it had more listening sockets than the farm reads at once"
        waiting = waiting_connections(rows, self.uid)
        if waiting * most_one_connection_holds() <= d.WAITING_CONNECTIONS_BYTES:
            return None
        return (
            f"{short} the {waiting} connections waiting in its listeners, which the kernel"
            " charges to no job until accepted, could hold more than"
            f" {d.WAITING_CONNECTIONS_BYTES // d.MIB} MB"
        )

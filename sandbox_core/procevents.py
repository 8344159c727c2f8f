"""Exit statuses of host processes the farm cannot wait for itself, as the kernel reports
them: the proc connector (netlink) announces every process exit with its raw wait
status. The Docker backend uses it for its `docker exec`s, whose exit code the engine
reports as 128+N for a signal N, which a job's own `exit 137` would fake.

Root only (the connector needs CAP_NET_ADMIN), one listener thread per process. It asks
the kernel (Linux >= 6.6, the connector's event filter) for exits with a nonzero status
only, the only ones that can be ambiguous: every fork and every other exit on the host
reached each worker process's listener, parsed in Python on no job's account, and a
job forking ~30,000 times a second made the docker workers' listeners drop events, so
other tenants' `exit 137` read as SIGKILL (an attack review, 2026-12-05).
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import threading
import time
from collections import OrderedDict

_NETLINK_CONNECTOR = 11
_CN_IDX_PROC = 1
_CN_VAL_PROC = 1
_PROC_CN_MCAST_LISTEN = 1
_PROC_EVENT_NONZERO_EXIT, _PROC_EVENT_EXIT = 0x20000000, 0x80000000
_FILTER_SINCE = (6, 6)  # struct proc_input; older kernels ignore a listen request of its size
_NLMSG_HDR = struct.Struct("=IHHII")  # len, type, flags, seq, pid
_CN_MSG = struct.Struct("=IIIIHH")  # idx, val, seq, ack, len, flags
_EVENT_HDR = struct.Struct("=IIQ")  # what, cpu, timestamp_ns (CLOCK_MONOTONIC)
_EXIT = struct.Struct("=IIII")  # pid, tgid, exit_code (raw wait status), exit_signal
_OFFSET_EVENT = _NLMSG_HDR.size + _CN_MSG.size
KEEP = 65_536  # recent exits remembered (a pid may exit before anyone asks for it)


def filters_events(release: str | None = None) -> bool:
    """Whether this kernel's connector takes an event filter (Linux 6.6)."""
    numbers = (release or os.uname().release).split("-")[0].split(".")
    try:
        return (int(numbers[0]), int(numbers[1])) >= _FILTER_SINCE
    except (IndexError, ValueError):
        return False


class ExitWatcher:
    """Recent process exits on this host: tgid -> (raw wait status, monotonic ns)."""

    _shared: ExitWatcher | None = None
    _shared_lock = threading.Lock()
    _unavailable: str | None = None

    def __init__(self, nonzero_only: bool = True) -> None:
        self._sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_CONNECTOR)
        self._closed = False
        try:
            with contextlib.suppress(OSError):  # a burst of exits must not overflow it
                self._sock.setsockopt(socket.SOL_SOCKET, 33, 8 << 20)  # SO_RCVBUFFORCE
            self._sock.bind((0, _CN_IDX_PROC))
            op = struct.pack("=I", _PROC_CN_MCAST_LISTEN)
            if nonzero_only and filters_events():  # struct proc_input: op, events wanted
                op += struct.pack("=I", _PROC_EVENT_NONZERO_EXIT)
            cn = _CN_MSG.pack(_CN_IDX_PROC, _CN_VAL_PROC, 0, 0, len(op), 0) + op
            self._sock.send(_NLMSG_HDR.pack(_NLMSG_HDR.size + len(cn), 3, 0, 0, 0) + cn)
        except OSError:
            self._sock.close()
            raise
        self._exits: OrderedDict[int, tuple[int, int]] = OrderedDict()
        self._cond = threading.Condition()
        self.lost = 0  # receive overflows: exits we may have missed
        threading.Thread(target=self._listen, name="sandfarm-exits", daemon=True).start()

    @classmethod
    def shared(cls) -> ExitWatcher | None:
        """This process's watcher, started on first use; None where the kernel or our
        privileges do not allow one (``why_unavailable`` says why)."""
        with cls._shared_lock:
            if cls._shared is None and cls._unavailable is None:
                if os.geteuid() != 0:
                    cls._unavailable = "not root"
                else:
                    try:
                        cls._shared = cls()
                    except OSError as exc:
                        cls._unavailable = f"no proc connector: {exc.strerror or exc}"
            return cls._shared

    @classmethod
    def why_unavailable(cls) -> str | None:
        cls.shared()
        return cls._unavailable

    def close(self) -> None:
        """Stop listening (its thread ends)."""
        self._closed = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()

    def _listen(self) -> None:
        while True:
            try:
                data = self._sock.recv(1 << 16)
            except OSError:  # ENOBUFS: events were dropped; keep listening
                if self._closed:
                    return
                self.lost += 1
                continue
            if not data and self._closed:
                return
            self._record(data)

    def heard(self) -> int:
        """How many exits it remembers."""
        with self._cond:
            return len(self._exits)

    def _record(self, data: bytes) -> None:
        offset = 0
        while offset + _OFFSET_EVENT + _EVENT_HDR.size <= len(data):
            length = _NLMSG_HDR.unpack_from(data, offset)[0]
            what, _, stamp = _EVENT_HDR.unpack_from(data, offset + _OFFSET_EVENT)
            if what == _PROC_EVENT_EXIT:
                body = offset + _OFFSET_EVENT + _EVENT_HDR.size
                pid, tgid, status, _ = _EXIT.unpack_from(data, body)
                if pid == tgid:  # the process, not one of its threads
                    with self._cond:
                        self._exits[tgid] = (status, stamp)
                        self._exits.move_to_end(tgid)
                        while len(self._exits) > KEEP:
                            self._exits.popitem(last=False)
                        self._cond.notify_all()
            if length <= 0:
                break
            offset += (length + 3) & ~3

    def status(self, pid: int, since_ns: int, wait_s: float = 0.5) -> int | None:
        """The raw wait status of process ``pid`` if it exited after ``since_ns``
        (time.monotonic_ns()), waiting up to ``wait_s`` for the event; else None."""
        deadline = time.monotonic() + wait_s
        with self._cond:
            while True:
                found = self._exits.get(pid)
                if found is not None and found[1] >= since_ns:
                    return found[0]
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(left)

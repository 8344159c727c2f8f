"""The TCP watch's own logic (sandbox_core/tcpwatch.py, sockdiag.py), and where the step
supervision asks it (runner.Supervisor)."""

from __future__ import annotations

import os
import socket
import struct
import time

from sandbox_core import defaults as d
from sandbox_core import sockdiag
from sandbox_core import tcpwatch as tw
from sandbox_core.models import Limits
from sandbox_core.runner import ExecOutcome, Supervisor
from sandbox_core.sockdiag import Listener


def _answer(uid: int, waiting: int, receive_buffer: int) -> bytes:
    """One sock_diag answer for a listener, as the kernel sends it."""
    meminfo = struct.pack("=9I", 0, receive_buffer, 0, 0, 0, 0, 0, 0, 0)
    attr = struct.pack("=HH", 4 + len(meminfo), 7) + meminfo
    body = struct.pack("=BBBB48xIIIII", socket.AF_INET, 10, 0, 0, 0, waiting, 64, uid, 1)
    body += attr
    return struct.pack("=IHHII", 16 + len(body), 20, 2, 1, 0) + body


def test_an_answer_gives_each_listeners_uid_queue_and_buffer() -> None:
    done = struct.pack("=IHHII", 20, 3, 2, 1, 0) + b"\0" * 4
    found: list[Listener] = []
    assert not sockdiag.parse(_answer(61001, 17, 8 << 20) + _answer(0, 5, 131072), found)
    assert sockdiag.parse(done, found)
    assert found == [Listener(61001, 17, 8 << 20), Listener(0, 5, 131072)]


def test_waiting_connections_count_by_their_listeners_buffer_and_uid() -> None:
    found = [Listener(61001, 3, 8 << 20), Listener(61001, 2, 131072), Listener(0, 900, 1 << 20)]
    waiting, most = tw.waiting_bytes(found, 61001)
    slack = 64 * d.KIB
    assert (waiting, most) == (5, 3 * ((8 << 20) + slack) + 2 * (131072 + slack))
    assert tw.waiting_bytes(found, 61002) == (0, 0)


def test_the_kernel_lists_this_namespaces_listeners() -> None:
    """A live read: a listener with three connections waiting, as this process's uid."""
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    clients = [socket.create_connection(srv.getsockname()) for _ in range(3)]
    try:
        found = tw.listeners_here() or []
    finally:
        for client in clients:
            client.close()
        srv.close()
    mine = [one for one in found if one.waiting == 3 and one.receive_buffer == 2 * 65536]
    assert len(mine) == 1 and mine[0].uid == os.geteuid(), found


def test_the_watch_stops_a_charge_past_the_bound() -> None:
    """The job's own TCP charge is read at every check; up to the bound and its
    overshoot the job runs on."""
    used = [d.TCP_BUFFERS_BYTES + d.TCP_OVERSHOOT_BYTES]
    watch = tw.TcpWatch(None, None, lambda: used[0], d.TCP_BUFFERS_BYTES, every_s=0.0)
    assert watch() is None
    used[0] += d.MIB
    why = watch()
    assert why is not None and why.startswith("its TCP buffers reached 129 MB"), why
    assert "past its bound of 64 MB" in why


def test_the_watch_stops_waiting_connections_past_their_bound() -> None:
    """By the job's own listeners only; too many to read is a stop in a namespace of its
    own, not in the host's, where other jobs listen too."""
    found: list[list[Listener] | None] = [[Listener(7, 15, 8 << 20)]]

    def watch_of(own: bool) -> tw.TcpWatch:
        return tw.TcpWatch(7, lambda: found[0], lambda: None, d.MIB, own, every_s=0.0)

    assert watch_of(True)() is None  # 15 x (8 MiB + 64 KiB) < 128 MiB
    found[0] = [Listener(7, 16, 8 << 20), Listener(8, 1000, 8 << 20)]
    why = watch_of(True)()
    assert why is not None and why.startswith("the 16 connections waiting"), why
    found[0] = None
    assert watch_of(True)() == "it had more than 1024 listening TCP sockets"
    assert watch_of(False)() is None


class _Watch:
    every_s = 0.01

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> str | None:
        self.calls += 1
        return "why" if self.calls >= 2 else None


def test_a_steps_leftovers_are_watched_while_they_drain() -> None:
    """After the main process exits, its leftovers run for EXIT_DRAIN_S: the watch is
    asked then too, and stops them (an attack review: 0.4 GB in that window)."""
    out, stops = ExecOutcome.for_limits(Limits()), []
    watch = _Watch()
    supervisor = Supervisor(
        out, Limits(), time.monotonic() + 10, None, lambda: stops.append(1), lambda: None, 0.0
    )
    supervisor.watch = watch
    assert supervisor.next_wait() == watch.every_s  # asked once: nothing yet
    supervisor.exited()
    supervisor.next_wait()  # draining: asked again, and it says stop
    assert out.watch_stopped and out.stopped_why == "why" and stops == [1]

"""The TCP watch's own logic (sandbox_core/tcpwatch.py, sockdiag.py), and where the step
supervision asks it (runner.Supervisor)."""

from __future__ import annotations

import os
import socket
import struct
import time
from pathlib import Path

import pytest

from sandbox_core import defaults as d
from sandbox_core import sockdiag
from sandbox_core import tcpwatch as tw
from sandbox_core.childsetup import in_own_thread, join_network_namespace, new_network_namespace
from sandbox_core.models import Limits
from sandbox_core.runner import ExecOutcome, Supervisor
from sandbox_core.sockdiag import Listener
from tests.conftest import require


def _answer(uid: int, waiting: int, receive_buffer: int) -> bytes:
    """One sock_diag answer for a listener, as the kernel sends it."""
    meminfo = struct.pack("=9I", 0, receive_buffer, 0, 0, 0, 0, 0, 0, 0)
    attr = struct.pack("=HH", 4 + len(meminfo), 7) + meminfo
    body = struct.pack("=BBBB48xIIIII", socket.AF_INET, 10, 0, 0, 0, waiting, 64, uid, 1)
    body += attr
    return struct.pack("=IHHII", 16 + len(body), 20, 2, 1, 0) + body


def test_an_answer_gives_each_listeners_uid_queue_and_buffer() -> None:
    """Other messages (a no-op, an acknowledgement) are no listeners; a message longer
    than what was read is an error, not a short read."""
    done = struct.pack("=IHHII", 20, 3, 2, 1, 0) + b"\0" * 4
    noop = struct.pack("=IHHII", 16, 1, 0, 1, 0)
    ack = struct.pack("=IHHIIi", 20, 2, 0, 1, 0, 0)
    found: list[Listener] = []
    answers = _answer(61001, 17, 8 << 20) + noop + ack + _answer(0, 5, 131072)
    assert not sockdiag.parse(answers, found)
    assert sockdiag.parse(done, found)
    assert found == [Listener(61001, 17, 8 << 20), Listener(0, 5, 131072)]
    with pytest.raises(OSError):
        sockdiag.parse(_answer(1, 1, 1)[:-8], [])
    with pytest.raises(OSError):
        sockdiag.parse(struct.pack("=IHHIIi", 20, 2, 0, 1, 0, -22), [])


def test_waiting_connections_count_at_the_most_one_can_hold() -> None:
    """Each at the largest buffer a listener could have had when it came (twice
    rmem_max): a job can shrink its listener's buffer once they have come (a review)."""
    worst = tw.most_one_connection_holds()
    rmem_max = int(Path("/proc/sys/net/core/rmem_max").read_text())
    assert worst == 2 * rmem_max + 64 * d.KIB
    found = [Listener(61001, 3, 1 << 40), Listener(61001, 2, 2304), Listener(0, 900, 1 << 20)]
    waiting, most = tw.waiting_bytes(found, 61001)
    assert (waiting, most) == (5, 3 * ((1 << 40) + 64 * d.KIB) + 2 * worst)
    assert tw.waiting_bytes(found, 61002) == (0, 0)


def test_a_changed_rmem_max_counts_from_the_next_check(monkeypatch, tmp_path):
    """A raised rmem_max counts at once (it was read once a worker, a review); a lowered
    one does not shrink the count: connections made before it keep their buffers."""
    rmem_max = tmp_path / "rmem_max"
    monkeypatch.setattr(tw, "_RMEM_MAX", rmem_max)
    monkeypatch.setattr(tw, "_most_seen", 0)
    rmem_max.write_text("4194304\n")
    assert tw.most_one_connection_holds() == 8 * d.MIB + 64 * d.KIB
    rmem_max.write_text("8388608\n")
    assert tw.most_one_connection_holds() == 16 * d.MIB + 64 * d.KIB
    rmem_max.write_text("212992\n")
    assert tw.most_one_connection_holds() == 16 * d.MIB + 64 * d.KIB


def test_the_kernel_lists_a_namespaces_listeners() -> None:
    """A live read, through the join of a namespace of its own: a listener with three
    connections waiting, as this process's uid."""
    require(os.geteuid() == 0, "needs root: a network namespace")
    netns_fd = new_network_namespace()

    def listen() -> list[socket.socket]:
        join_network_namespace(netns_fd)
        srv = socket.socket()
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        srv.bind(("127.0.0.1", 0))
        srv.listen(8)
        return [srv, *(socket.create_connection(srv.getsockname()) for _ in range(3))]

    held = in_own_thread(listen)
    try:
        assert tw.listeners_in_namespace(netns_fd) == ([Listener(0, 3, 2 * 65536)], True)
    finally:
        for sock in held:
            sock.close()
        os.close(netns_fd)


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
    """By the job's own listeners only. Too many to read is a stop in a namespace of its
    own; in the host's, where other jobs listen too, only if some read are its own."""
    worst = tw.most_one_connection_holds()
    fits = d.WAITING_CONNECTIONS_BYTES // worst
    found: list[tw.Found] = [([Listener(7, fits, 0)], True)]

    def watch_of(own: bool) -> tw.TcpWatch:
        return tw.TcpWatch(7, lambda: found[0], lambda: None, d.MIB, own, every_s=0.0)

    assert watch_of(True)() is None
    found[0] = ([Listener(7, fits + 1, 0), Listener(8, 10_000, 0)], True)
    why = watch_of(True)()
    assert why is not None and why.startswith(f"the {fits + 1} connections waiting"), why
    found[0] = ([Listener(8, 0, 0)], False)
    assert watch_of(True)() == "it had more than 1024 listening TCP sockets"
    assert watch_of(False)() is None
    found[0] = ([Listener(8, 0, 0), Listener(7, 0, 0)], False)
    assert watch_of(False)() == "it had more than 1024 listening TCP sockets"


def test_an_unreadable_namespace_leaves_the_job_running() -> None:
    """The farm's failure (no sock_diag), not the job's: logged, and not read again."""
    calls = []

    def fails() -> tw.Found:
        calls.append(1)
        raise OSError(2, "no sock_diag")

    watch = tw.TcpWatch(7, fails, lambda: None, d.MIB, every_s=0.0)
    assert watch() is None and watch() is None and calls == [1]


class _Watch:
    def __init__(self) -> None:
        self.calls = 0
        self.next_check = 0.0

    def __call__(self) -> str | None:
        self.calls += 1
        return "why" if self.calls >= 2 else None


def test_a_steps_leftovers_are_watched_while_they_drain() -> None:
    """After the main process exits, its leftovers run for EXIT_DRAIN_S: the watch is
    asked then too, and stops them (an attack review: 0.4 GB in that window)."""
    out, stops = ExecOutcome.for_limits(Limits()), []
    watch = _Watch()
    supervisor = Supervisor(
        out,
        Limits(),
        time.monotonic() + 10,
        None,
        lambda: stops.append(1),
        lambda: None,
        kill_drain_s=0.0,
        watch=watch,
    )
    assert supervisor.next_wait() == 0.0  # asked once: nothing yet (and due again now)
    supervisor.exited()
    supervisor.next_wait()  # draining: asked again, and it says stop
    assert out.watch_stopped and out.stopped_why == "why" and stops == [1]


def test_doctor_says_how_many_clients_a_job_may_keep_waiting() -> None:
    from producer.commands.local import _waiting_connections_row

    row = _waiting_connections_row()
    fits = d.WAITING_CONNECTIONS_BYTES // tw.most_one_connection_holds()
    assert f"a job may keep {fits} connections waiting" in str(row["detail"]), row
    assert row["active"] == (fits >= 64)
    assert ("net.core.rmem_max=212992" in str(row["detail"])) == (fits < 64), row

"""Counting the connections waiting in a job's listeners (sandbox_core/tcpwatch.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandbox_core import defaults as d
from sandbox_core import tcpwatch as aq

HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid\n"
TCP = HEADER + (
    "   0: 0100007F:9C40 00000000:0000 0A 00000000:00000011 00:00000000 00000000 61001 0 1\n"
    "   1: 0100007F:9C41 00000000:0000 0A 00000000:00000005 00:00000000 00000000     0 0 2\n"
    "   2: 0100007F:9C42 0100007F:A000 01 00000000:00100000 00:00000000 00000000 61001 0 3\n"
    "   3: 0100007F:9C44 00000000:0000 0A 00000000:00000100 00:00000000 00000000 61001 0 5\n"
)
TCP6 = HEADER + (
    "   0: 00000000000000000000000001000000:9C43 00000000000000000000000000000000:0000"
    " 0A 00000000:00000002 00:00000000 00000000 61001 0 4\n"
)


def test_waiting_connections_are_counted_by_the_listeners_uid(tmp_path: Path) -> None:
    """A listener's rx_queue is its accept queue: only LISTEN rows of the job's uid count,
    and reading a table stops at its first other row (the kernel lists every listener
    first), so a row after it is never read."""
    (tmp_path / "tcp").write_text(TCP)
    (tmp_path / "tcp6").write_text(TCP6)
    rows = aq.listener_rows(str(tmp_path))
    assert len(rows) == 3, rows
    assert aq.waiting_connections(rows, 61001) == 0x11 + 2
    assert aq.waiting_connections(rows, 61002) == 0
    assert aq.waiting_connections(rows, 0) == 5


def test_a_gone_process_raises_and_many_listeners_are_not_read(tmp_path: Path) -> None:
    """More listener rows than the watch reads is no count: None (the job is stopped if
    the host is short), never a partial count read as small."""
    with pytest.raises(OSError):
        aq.rows_of_process(2**22 + 1)  # past pid_max
    assert isinstance(aq.rows_here(), list)
    row = TCP.splitlines()[1] + "\n"
    (tmp_path / "tcp").write_text(HEADER + row * 1024)
    (tmp_path / "tcp6").write_text(HEADER)
    assert len(aq.listener_rows(str(tmp_path)) or []) == 1024
    (tmp_path / "tcp").write_text(HEADER + row * 1025)
    assert aq.listener_rows(str(tmp_path)) is None


def test_the_watch_stops_a_charge_past_the_bound_at_any_time() -> None:
    """The job's own TCP charge is read at every check, the host short of memory or not;
    up to the bound and its overshoot it runs on."""
    used = [d.TCP_BUFFERS_BYTES + d.TCP_OVERSHOOT_BYTES]
    watch = aq.TcpWatch(None, None, lambda: used[0], d.TCP_BUFFERS_BYTES, every_s=0.0)
    assert watch() is None
    used[0] += d.MIB
    why = watch()
    assert why is not None and why.startswith("its TCP buffers reached 129 MB"), why
    assert "past its bound of 64 MB" in why

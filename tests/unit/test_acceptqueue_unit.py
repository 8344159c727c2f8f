"""Counting the connections waiting in a job's listeners (sandbox_core/acceptqueue.py)."""

from __future__ import annotations

from sandbox_core import acceptqueue as aq


def test_waiting_connections_are_counted_by_the_listeners_uid():
    """The count reads a listener's accept queue (rx_queue) from /proc/net/tcp and tcp6
    rows in state LISTEN owned by the job's uid, and nothing else."""
    header = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid\n"
    tcp = header + (
        "   0: 0100007F:9C40 00000000:0000 0A 00000000:00000011 00:00000000 00000000 61001 0 1\n"
        "   1: 0100007F:9C41 00000000:0000 0A 00000000:00000005 00:00000000 00000000     0 0 2\n"
        "   2: 0100007F:9C42 0100007F:A000 01 00000000:00100000 00:00000000 00000000 61001 0 3\n"
    )
    tcp6 = header + (
        "   0: 00000000000000000000000001000000:9C43 00000000000000000000000000000000:0000"
        " 0A 00000000:00000002 00:00000000 00000000 61001 0 4\n"
    )
    assert aq.waiting_connections([tcp, tcp6], 61001) == 0x11 + 2
    assert aq.waiting_connections([tcp, tcp6], 61002) == 0

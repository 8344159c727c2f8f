"""Connections waiting to be accepted: charged to no cgroup, so watched (acceptqueue.py).

The attack: listen with the largest receive buffer the host allows, connect to itself,
fill each connection, reset its own end, never accept. The kernel keeps the data until
the listener closes, in the host's one tcp_mem pool. Each test first proves the attack
outside the sandbox: it takes the host's TCP memory past the kernel's pressure-free mark.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox_core import Status, StepStatus
from sandbox_core import acceptqueue as aq

# Fills connections that wait in its listeners until the host's TCP memory reaches GOAL
# pages (or it has made 4,096); prints how many and what the host's TCP memory grew by.
HOLDS_WAITING_CONNECTIONS = """
import os, socket, struct, time
def pages():
    for line in open("/proc/net/sockstat"):
        if line.startswith("TCP:"):
            f = line.split(); return int(f[f.index("mem") + 1])
goal, start, data = int(os.environ["GOAL"]), pages(), b"x" * 65536
def fill(c):
    try:
        while True:
            c.send(data)
    except BlockingIOError:
        pass
listeners, waiting = [], 0
while pages() < goal and waiting < 4096:
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 30)  # to 2 x rmem_max
    srv.bind(("127.0.0.1", 0)); srv.listen(64); listeners.append(srv)
    for _ in range(64):
        c = socket.create_connection(srv.getsockname()); c.setblocking(False)
        fill(c); time.sleep(0.002); fill(c)  # the window opens as the first lands
        c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        c.close(); waiting += 1  # reset: conntrack forgets it, the kernel keeps its data
        if pages() >= goal:
            break
print(waiting, pages() - start, flush=True)
time.sleep(1)
"""


def _tcp_mem() -> list[int]:
    return [int(v) for v in Path("/proc/sys/net/ipv4/tcp_mem").read_text().split()]


class PeakTcpPages:
    """The host's highest TCP memory (pages) while it runs: sampled every 5 ms."""

    def __init__(self) -> None:
        self.peak = aq.host_tcp_pages()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._done.wait(0.005):
            self.peak = max(self.peak, aq.host_tcp_pages())

    def __enter__(self) -> PeakTcpPages:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._done.set()
        self._thread.join()


def _settled(below: int) -> int:
    """The host's TCP memory once it is back under ``below`` pages (within 10 s)."""
    deadline = time.monotonic() + 10
    while (pages := aq.host_tcp_pages()) >= below and time.monotonic() < deadline:
        time.sleep(0.1)
    return pages


@pytest.fixture
def goal() -> Iterator[dict[str, str]]:
    """The attack's goal: 10% past tcp_mem[0], short of tcp_mem[1] (pressure)."""
    low, pressure, _ = _tcp_mem()
    assert pressure > low * 11 // 10, (low, pressure)
    assert _settled(low // 2) < low // 2, "the host's TCP memory is high before the test"
    yield {"GOAL": str(low * 11 // 10)}
    assert _settled(low) < low, "the host's TCP memory stayed high after the test"


def test_connections_waiting_to_be_accepted_are_bounded(run, goal, tmp_path):
    """A default job held ~1.6 GB of the host's TCP memory in connections it never
    accepted, on every backend, against its own TCP bound of 64 MiB (an attack review):
    two such jobs stall every TCP connection on the host. Now it is stopped once the
    host's TCP memory is past tcp_mem[0], long before the kernel's pressure mark."""
    script = tmp_path / "hold.py"
    script.write_text(HOLDS_WAITING_CONNECTIONS)
    bare = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **goal},
    )
    assert bare.returncode == 0, bare
    low, pressure, _ = _tcp_mem()
    waiting, grew = (int(word) for word in bare.stdout.split())
    assert aq.host_tcp_pages() < low  # the bare run's listeners are closed
    assert grew > low // 2 and waiting < 4096, bare.stdout  # the attack works unconfined
    _settled(low // 2)
    with PeakTcpPages() as host:
        result = run(code=HOLDS_WAITING_CONNECTIONS, env=goal, limits={"timeout_s": 120})
    assert result.status == Status.MEMORY_EXCEEDED, result
    step = result.steps[0]
    assert step.status == StepStatus.MEMORY_EXCEEDED, step
    assert "connections waiting in its listeners" in result.message, result.message
    assert host.peak > low, host.peak  # it did take the host's TCP memory past the mark
    assert host.peak < pressure, (host.peak, pressure)  # and was stopped short of pressure
    assert _settled(low) < low  # what it held is freed with its sandbox


def test_a_server_with_waiting_clients_is_not_stopped(run):
    """Clients that connect and send before the server accepts them are how servers
    work: with the host's TCP memory low, a job serving them runs to its end."""
    code = """
import socket, threading
srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(128)
clients = [socket.create_connection(srv.getsockname()) for _ in range(100)]
for c in clients:
    c.sendall(b"x" * 100_000)
import time; time.sleep(0.5)  # all wait to be accepted, past the watch's first check
got = 0
for _ in clients:
    s, _ = srv.accept()
    s.settimeout(5)
    need = 100_000
    while need:
        need -= len(s.recv(65536))
    got += 1
print(got)
"""
    result = run(code=code, limits={"timeout_s": 60})
    assert result.status == Status.SUCCEEDED, result
    assert result.steps[0].stdout == "100\n"

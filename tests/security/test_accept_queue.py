"""TCP memory the kernel charges past a job's bound, so watched (tcpwatch.py).

Connections waiting to be accepted are charged to no cgroup; a connection accepted after
it filled is charged past any limit. Each test first proves its attack outside the
sandbox: it holds far more of the host's TCP memory than a job's bound.
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

from sandbox_core import Status, StepStatus, parse_spec, tcpwatch
from sandbox_core import defaults as d
from tests.conftest import require
from tests.security.conftest import make_backend
from tests.security.helpers import backend_kind

# Every attack: the host's TCP memory in pages, from where it starts.
PAGES = """
import os, socket, struct, time
def pages():
    for line in open("/proc/net/sockstat"):
        if line.startswith("TCP:"):
            f = line.split(); return int(f[f.index("mem") + 1])
start = pages()
data = b"x" * 65536
"""
# The first two: the goal GROW_MB past where it starts.
GROWS_BY = (
    PAGES
    + """goal = start + (int(os.environ["GROW_MB"]) << 20) // 4096
"""
)
# Fills connections that wait in its listeners until the host's TCP memory has grown by
# GROW_MB (or it has made 4,096), then holds them; prints how many and the growth in MB.
HOLDS_WAITING_CONNECTIONS = (
    GROWS_BY
    + """
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
print(waiting, (pages() - start) * 4096 >> 20, flush=True)
time.sleep(1)
"""
)
# PROCS processes each fill a connection while it waits, reset its client, then accept
# it and keep it, one at a time (so at most PROCS wait at once), until the host's TCP
# memory has grown by GROW_MB or each holds 240; prints how much it grew by at the most.
FILLS_THEN_ACCEPTS = (
    GROWS_BY
    + """
def fill(c):
    idle = 0
    while idle < 3:
        try:
            while True:
                c.send(data); idle = 0
        except BlockingIOError:
            idle += 1; time.sleep(0.001)
def hold():
    kept = []
    while pages() < goal and len(kept) < 240:
        srv = socket.socket()
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 30)
        srv.bind(("127.0.0.1", 0)); srv.listen(1)
        c = socket.create_connection(srv.getsockname()); c.setblocking(False)
        fill(c)
        c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)); c.close()
        kept.append(srv.accept()[0]); srv.close()  # charged now, past any limit
    time.sleep(2)
kids = []
for _ in range(int(os.environ["PROCS"])):
    pid = os.fork()
    if pid == 0:
        hold(); os._exit(0)
    kids.append(pid)
peak = start
while kids:
    kids = [pid for pid in kids if os.waitpid(pid, os.WNOHANG) == (0, 0)]
    peak = max(peak, pages()); time.sleep(0.02)
print((peak - start) * 4096 >> 20)
"""
)
FILL_THEN_ACCEPT = {"PROCS": "4", "GROW_MB": "512"}
# Raises its listener's receive buffer with SO_RCVLOWAT (to tcp_rmem[2]) unless refused,
# lets WAITING clients connect, shrinks the listener's buffer again (theirs stay), fills
# each client's connection while it waits and resets the client; prints whether
# SO_RCVLOWAT was refused and how far the host's TCP memory grew (MB), then holds it.
RAISES_LOW_WATER = (
    PAGES
    + """
try:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 1 << 30)
    refused = 0
except PermissionError:
    refused = 1
srv = socket.socket()
if not refused:
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 1 << 30)
srv.bind(("127.0.0.1", 0)); srv.listen(64)
conns = [socket.create_connection(srv.getsockname()) for _ in range(int(os.environ["WAITING"]))]
srv.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
for c in conns:
    c.setblocking(False)
idle, deadline = 0, time.monotonic() + 40
while idle < 100 and time.monotonic() < deadline:
    moved = 0
    for c in conns:
        try:
            while True:
                moved += c.send(data)
        except BlockingIOError:
            pass
    idle = 0 if moved else idle + 1
    time.sleep(0.002)
for c in conns:
    c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)); c.close()
print(refused, (pages() - start) * 4096 >> 20, flush=True)
time.sleep(1)
"""
)
SLOT = 242  # a slot of its own: the job follows another in it (out of the other tests' way)


def _host_tcp_pages() -> int:
    """The host's TCP buffer memory in pages (every network namespace's, as tcp_mem)."""
    for line in Path("/proc/net/sockstat").read_text().splitlines():
        if line.startswith("TCP:"):
            fields = line.split()
            return int(fields[fields.index("mem") + 1])
    raise AssertionError("no TCP line in /proc/net/sockstat")


class PeakTcpPages:
    """The host's highest TCP memory (pages) while it runs: sampled every 5 ms."""

    def __init__(self) -> None:
        self.peak = _host_tcp_pages()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._done.wait(0.005):
            self.peak = max(self.peak, _host_tcp_pages())

    def __enter__(self) -> PeakTcpPages:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._done.set()
        self._thread.join()


def _settled() -> int:
    """The host's TCP memory (pages) once an earlier test's sockets are gone (within 10 s:
    what is left is the host's own)."""
    last, deadline = _host_tcp_pages(), time.monotonic() + 10
    while time.monotonic() < deadline:
        time.sleep(0.2)
        now = _host_tcp_pages()
        if now <= last and now < (64 << 20) // 4096:
            return now
        last = now
    return last


@pytest.fixture
def hold_waiting() -> dict[str, str]:
    """The attack's goal: 768 MB, or half of tcp_mem[0] where that is less (the bare run
    must stay clear of the kernel's pressure on every socket of the host)."""
    require(os.geteuid() == 0, "needs root: without it a job has no uid of its own to watch")
    low = int(Path("/proc/sys/net/ipv4/tcp_mem").read_text().split()[0])
    return {"GROW_MB": str(min(768, low * 4096 // 2 >> 20))}


def test_connections_waiting_to_be_accepted_are_bounded(backend, hold_waiting, tmp_path):
    """A default job held ~1.6 GB of the host's TCP memory in connections it never
    accepted, on every backend, against its own TCP bound of 64 MiB (an attack review):
    two such jobs stall every TCP connection on the host. Now it is stopped once they
    could hold 128 MiB. It runs as the farm runs jobs: after another job in the slot, in
    the standby made there."""
    script = tmp_path / "hold.py"
    script.write_text(HOLDS_WAITING_CONNECTIONS)
    before = _settled()
    bare = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **hold_waiting},
    )
    assert bare.returncode == 0, bare
    waiting, grew = (int(word) for word in bare.stdout.split())
    grow = int(hold_waiting["GROW_MB"])
    assert grew >= grow and waiting < 4096, bare.stdout  # the attack works unconfined
    assert _settled() < before + (64 << 20) // 4096  # and its memory went with it
    kind = backend_kind(backend)
    sandbox = make_backend(kind, slot=SLOT, **({} if kind == "docker" else {"prewarm": True}))
    try:
        first = sandbox.run(parse_spec({"code": "print(1)"}))
        before = _settled()
        with PeakTcpPages() as host:
            spec = {"code": HOLDS_WAITING_CONNECTIONS, "env": hold_waiting}
            result = sandbox.run(parse_spec({**spec, "limits": {"timeout_s": 120}}))
    finally:
        sandbox.close()
    assert first.status == Status.SUCCEEDED, first
    if kind != "docker":  # docker's warm and cold steps share one supervised exec
        assert result.timings.phases.prewarmed, result.timings.phases  # the farm's path
    assert result.status == Status.MEMORY_EXCEEDED, result
    step = result.steps[0]
    assert step.status == StepStatus.MEMORY_EXCEEDED, step
    assert "connections waiting in its listeners" in result.message, result.message
    held = (host.peak - before) * 4096
    bound = d.WAITING_CONNECTIONS_BYTES
    # it ran, and was stopped once what waited could hold the bound (at ~8 MiB each here)
    assert 16 * d.MIB < held < 3 * bound, (held, bound)
    assert _settled() < before + (64 << 20) // 4096  # what it held went with its sandbox


def test_a_listener_cannot_raise_what_its_waiting_connections_hold(backend, tmp_path):
    """The watch counts each waiting connection at the most it could hold: twice
    rmem_max and a packet, or its listener's buffer if larger. SO_RCVLOWAT raised a
    listener's buffer to tcp_rmem[2] (32 MiB on this VM image), every connection waiting
    in it inherited that, and the listener shrank its own again: 15 waiting held ~480 MB,
    counted at ~121 MiB, under the bound, never stopped (found 2026-12-05). The syscall
    filter now refuses SO_RCVLOWAT, on every backend."""
    require(os.geteuid() == 0, "needs root: without it a job has no uid of its own to watch")
    rmem_max = int(Path("/proc/sys/net/core/rmem_max").read_text())
    rmem = int(Path("/proc/sys/net/ipv4/tcp_rmem").read_text().split()[2])
    if rmem <= 2 * rmem_max:
        pytest.skip(f"tcp_rmem[2] ({rmem}) is within 2 x rmem_max here: no attack to make")
    waiting = d.WAITING_CONNECTIONS_BYTES // tcpwatch.most_one_connection_holds()
    env = {"WAITING": str(waiting)}
    script = tmp_path / "low_water.py"
    script.write_text(RAISES_LOW_WATER)
    before = _settled()
    bare = subprocess.run(  # 9 are enough to pass twice the bound (the suite's fake runs
        [sys.executable, str(script)],  # make this at once, four times)
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "WAITING": "9"},
    )
    assert bare.returncode == 0, bare
    refused, grew = (int(word) for word in bare.stdout.split())
    # the attack, unconfined: what waits holds far more than the watch would count
    assert refused == 0 and grew << 20 > 2 * d.WAITING_CONNECTIONS_BYTES, bare.stdout
    assert _settled() < before + (64 << 20) // 4096
    before = _settled()
    with PeakTcpPages() as host:
        result = backend.run(
            parse_spec({"code": RAISES_LOW_WATER, "env": env, "limits": {"timeout_s": 120}})
        )
    assert result.status == Status.SUCCEEDED, result
    refused, grew = (int(word) for word in result.steps[0].stdout.split())
    assert refused == 1, result.steps[0].stdout  # EPERM, a clean Python error
    held = (host.peak - before) * 4096
    assert held < d.WAITING_CONNECTIONS_BYTES, (held, grew)  # the job ran; it held little
    assert _settled() < before + (64 << 20) // 4096


def test_a_server_with_waiting_clients_is_not_stopped(run):
    """Clients that connect and send before the server accepts them are how servers
    work: a job serving as many as the watch allows at once (each counted at the most
    one could hold: 14 here, with rmem_max at 4 MiB) runs to its end."""
    clients = min(100, d.WAITING_CONNECTIONS_BYTES // tcpwatch.most_one_connection_holds())
    code = """
import os, socket, time
n = int(os.environ["CLIENTS"])
srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(128)
clients = [socket.create_connection(srv.getsockname()) for _ in range(n)]
for c in clients:
    c.sendall(b"x" * 100_000)
time.sleep(0.5)  # all wait to be accepted, past the watch's first checks
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
    result = run(code=code, env={"CLIENTS": str(clients)}, limits={"timeout_s": 60})
    assert result.status == Status.SUCCEEDED, result
    assert result.steps[0].stdout == f"{clients}\n"


@pytest.fixture
def under_a_tcp_limit(tmp_path: Path) -> Iterator[Path]:
    """A script that runs FILLS_THEN_ACCEPTS under a cgroup v1 TCP limit of
    TCP_BUFFERS_BYTES, as a job's, with no watch (the group removed after)."""
    require(os.geteuid() == 0, "needs root: a memory cgroup")
    memory = Path("/sys/fs/cgroup/memory")
    if not (memory / "memory.kmem.tcp.limit_in_bytes").exists():
        pytest.skip("cgroup v1's TCP limit only: v2 charges socket buffers to memory.max")
    group = memory / f"sandfarm-test-accept-{os.getpid()}"
    group.mkdir(exist_ok=True)
    (group / "memory.kmem.tcp.limit_in_bytes").write_text(str(d.TCP_BUFFERS_BYTES))
    script = tmp_path / "fill_then_accept.py"
    script.write_text(
        f"open('{group}/cgroup.procs', 'w').write(str(__import__('os').getpid()))\n"
        + FILLS_THEN_ACCEPTS
    )
    try:
        yield group
    finally:
        for _ in range(50):  # its sockets close as its processes go
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.2)


def test_connections_accepted_after_they_fill_are_stopped_past_the_bound(
    run, under_a_tcp_limit, tmp_path
):
    """The kernel charges a connection at accept() whatever the job's TCP limit: a job
    that filled each connection while it waited, then accepted it, held ~1.6 GB charged
    to its bound of 64 MiB, on every backend, with no more than 8 waiting at once (a
    review of the watch on waiting connections). Its charge is now read at every check:
    past the bound by TCP_OVERSHOOT_BYTES, the step is stopped."""
    script = tmp_path / "fill_then_accept.py"
    bare = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **FILL_THEN_ACCEPT},
    )
    assert bare.returncode == 0, bare
    charged = int((under_a_tcp_limit / "memory.kmem.tcp.max_usage_in_bytes").read_text())
    assert charged > 4 * d.TCP_BUFFERS_BYTES, charged  # the attack: charged past the limit
    assert int(bare.stdout) > 4 * d.TCP_BUFFERS_BYTES >> 20, bare.stdout
    before = _settled()
    with PeakTcpPages() as host:
        result = run(code=FILLS_THEN_ACCEPTS, env=FILL_THEN_ACCEPT, limits={"timeout_s": 120})
    assert result.status == Status.MEMORY_EXCEEDED, result
    assert "its TCP buffers reached" in result.message, result.message
    bound = d.TCP_BUFFERS_BYTES + d.TCP_OVERSHOOT_BYTES
    held = (host.peak - before) * 4096
    assert bound < held < 2 * bound, (held, bound)  # stopped within a check of the bound
    assert _settled() < before + (64 << 20) // 4096  # what it held went with its sandbox

"""A job's TCP socket buffers, in the kernel's one ``tcp_mem`` pool for the whole host.

Cgroup v1 leaves them out of a memory limit, so a job is given a TCP limit of its own
(defaults.TCP_BUFFERS_BYTES; v2 charges them to its memory limit). The kernel lets each
socket queue about a packet past any limit, so a job's loopback has small packets
(defaults.LOOPBACK_PACKET_BYTES, sandbox_core/loopback.py). Each test first proves its
attack works outside the sandbox.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox_core import Status, parse_spec
from sandbox_core import defaults as d
from tests.conftest import require
from tests.security.conftest import docker_status, make_backend

# Two processes each open loopback connections to themselves and write without reading
# until MB megabytes are queued or the kernel stops them; prints what each queued, and
# the host-wide TCP memory (pages: /proc/net/sockstat counts every namespace's) while
# they hold it.
HOARDS_TCP_BUFFERS = """
import os, socket, time
MB = int(os.environ["MB"]) << 20
def tcp_pages():
    for line in open("/proc/net/sockstat"):
        if line.startswith("TCP:"):
            return int(line.split()[-1])
r, w = os.pipe()
for _ in range(2):
    if os.fork() == 0:
        srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(512)
        keep, total = [], 0
        while total < MB:
            try:
                c = socket.create_connection(srv.getsockname()); s, _ = srv.accept()
            except OSError:
                break
            c.setblocking(False); keep.append((c, s))
            t0 = time.monotonic()
            while total < MB and time.monotonic() - t0 < 0.5:
                try:
                    total += c.send(b"x" * 65536)
                except BlockingIOError:
                    break
        os.write(w, b"%d\\n" % (total >> 20)); time.sleep(1.0); os._exit(0)
os.close(w)
done = os.fdopen(r)
queued = [done.readline().strip() for _ in range(2)]  # both hold theirs for a second
print(" ".join(queued), tcp_pages())
"""


def test_tcp_buffers_are_bounded_by_the_job(run, tmp_path):
    """Cgroup v1 leaves TCP socket buffers out of a memory limit, and the kernel's tcp_mem
    is one pool for the whole host: a default job queued ~800 MB on its loopback and
    could fill it, stalling the workers' Redis traffic (an attack review). A job's
    buffers are bounded (defaults.TCP_BUFFERS_BYTES; v2: its memory limit)."""
    script = tmp_path / "hoard.py"
    script.write_text(HOARDS_TCP_BUFFERS)
    env = {**os.environ, "MB": "150"}
    bare = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, env=env
    )
    *queued, _ = bare.stdout.split()
    assert [int(q) for q in queued] == [150, 150], bare  # the attack works unconfined
    before = _tcp_pages()
    limits = {"timeout_s": 60, "memory_mb": 128}  # v2 charges the buffers to this limit
    result = run(code=HOARDS_TCP_BUFFERS, env={"MB": "150"}, limits=limits)
    assert result.status == Status.SUCCEEDED, result
    *queued, during = result.steps[0].stdout.split()
    assert queued and int(during) > before, result.steps[0].stdout  # it ran, and held some
    bound = max(d.TCP_BUFFERS_BYTES, 128 * d.MIB)  # v1's TCP limit, or v2's memory limit
    allowed = (bound * 3 // 2) // 4096  # in pages, with the kernel's slack
    assert int(during) - before < allowed, (during, before, queued)
    assert sum(int(q) for q in queued) < 300, queued  # it asked for 2 x 150 MB


def _settled_tcp_pages() -> int:
    """The host's TCP memory once an earlier test's sockets are gone (within 5 s)."""
    last, deadline = _tcp_pages(), time.monotonic() + 5
    while time.monotonic() < deadline:
        time.sleep(0.2)
        now = _tcp_pages()
        if now == last:
            break
        last = now
    return last


def _tcp_pages() -> int:
    for line in Path("/proc/net/sockstat").read_text().splitlines():
        if line.startswith("TCP:"):
            return int(line.split()[-1])
    raise AssertionError("no TCP line in /proc/net/sockstat")


# PROCS processes each open PAIRS loopback connections to themselves and fill both ends
# without reading, until the kernel stops them; once all hold theirs, prints how many
# sockets they hold and the host-wide TCP memory in pages.
HOLDS_MANY_CONNECTIONS = """
import os, socket, time
PROCS, PAIRS = int(os.environ["PROCS"]), int(os.environ["PAIRS"])
def tcp_pages():
    for line in open("/proc/net/sockstat"):
        if line.startswith("TCP:"):
            return int(line.split()[-1])
def fill(sock):
    t0 = time.monotonic()
    while time.monotonic() - t0 < 0.05:
        try:
            sock.send(b"x" * 65536)
        except OSError:  # full, or refused past the bound
            return
ready_r, ready_w = os.pipe()
go_r, go_w = os.pipe()
for _ in range(PROCS):
    if os.fork() == 0:
        os.close(go_w)
        srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(PAIRS)
        keep = []
        for _ in range(PAIRS):
            try:
                c = socket.create_connection(srv.getsockname()); s, _ = srv.accept()
            except OSError:
                break
            c.setblocking(False); s.setblocking(False); keep.append((c, s))
            fill(c); fill(s)
        os.write(ready_w, b"%d\\n" % (2 * len(keep)))
        os.read(go_r, 1)  # hold them until the parent has measured
        os._exit(0)
os.close(ready_w); os.close(go_r)
done = os.fdopen(ready_r)
sockets = sum(int(done.readline()) for _ in range(PROCS))
print(sockets, tcp_pages())
"""
MANY = {"PROCS": "4", "PAIRS": "100"}  # 800 sockets


@pytest.fixture
def outside_the_sandbox(tmp_path: Path) -> Iterator[Path]:
    """A script path whose runs hold their sockets as a job would without the fix: in a
    fresh network namespace with loopback as the kernel makes it, under a cgroup v1 TCP
    limit of TCP_BUFFERS_BYTES (both named for this test process, removed after)."""
    require(os.geteuid() == 0, "needs root: a network namespace and a memory cgroup")
    memory = Path("/sys/fs/cgroup/memory")
    if not (memory / "memory.kmem.tcp.limit_in_bytes").exists():
        pytest.skip("cgroup v1's TCP limit only: v2 charges socket buffers to memory.max")
    name = f"sandfarm-test-tcp-{os.getpid()}"
    group = memory / name
    group.mkdir(exist_ok=True)
    (group / "memory.kmem.tcp.limit_in_bytes").write_text(str(d.TCP_BUFFERS_BYTES))
    subprocess.run(["ip", "netns", "add", name], check=True, timeout=30)
    subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True, timeout=30)
    script = tmp_path / "hold.py"
    script.write_text(
        f"import os\nopen('{group}/cgroup.procs', 'w').write(str(os.getpid()))\n"
        f"os.execvp('ip', ['ip', 'netns', 'exec', '{name}', '{sys.executable}', '-c', "
        f"{HOLDS_MANY_CONNECTIONS!r}])\n"
    )
    try:
        yield script
    finally:
        subprocess.run(["ip", "netns", "delete", name], timeout=30)
        for _ in range(50):  # the namespace's sockets close as it goes
            try:
                group.rmdir()
                break
            except OSError:
                subprocess.run(["sleep", "0.2"])


def _excess_per_socket(stdout: str, before: int) -> tuple[int, float]:
    """(sockets held, bytes a socket past the TCP bound) from HOLDS_MANY_CONNECTIONS."""
    sockets, during = (int(word) for word in stdout.split())
    held = (during - before) * 4096
    assert held > d.TCP_BUFFERS_BYTES * 9 // 10, (held, stdout)  # it filled the bound
    return sockets, (held - d.TCP_BUFFERS_BYTES) / sockets


def test_many_connections_pass_the_tcp_bound_by_little(run, outside_the_sandbox):
    """The kernel lets each TCP socket queue about a packet past its cgroup's limit:
    ~64 KiB on loopback as the kernel makes it, so a job's 16,384 sockets at the default
    limits passed its bound by ~1 GiB, half this host's tcp_mem (a review of the TCP
    bound). A job's loopback has 8 KiB packets: a quarter of that."""
    env = {**os.environ, **MANY}
    before = _settled_tcp_pages()
    bare = subprocess.run(
        [sys.executable, str(outside_the_sandbox)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert bare.returncode == 0, bare
    sockets, bare_excess = _excess_per_socket(bare.stdout, before)
    assert sockets == 800 and bare_excess > 40_000, (sockets, bare_excess)  # the attack
    before = _settled_tcp_pages()
    limits = {"timeout_s": 60, "memory_mb": 64, "processes": 8}  # a TCP bound of 64 MiB
    result = run(code=HOLDS_MANY_CONNECTIONS, env=MANY, limits=limits)
    assert result.status == Status.SUCCEEDED, result
    sockets, excess = _excess_per_socket(result.steps[0].stdout, before)
    assert sockets == 800, result.steps[0].stdout  # as many sockets as outside
    assert excess < min(bare_excess / 2, 3 * d.LOOPBACK_PACKET_BYTES), (excess, bare_excess)


def test_every_runc_runtime_gives_jobs_the_small_loopback():
    """The engine's other name for runc got the kernel's loopback (an attack review):
    only gVisor, whose jobs use a network stack of its own, goes without."""
    ok, reason = docker_status("runc")
    require(ok, reason)
    runtime = "io.containerd.runc.v2"
    backend = make_backend("docker", runtime=runtime)
    try:
        require(runtime in backend.probe().runtimes, f"the engine has no {runtime}")
        result = backend.run(parse_spec({"command": "cat /sys/class/net/lo/mtu"}))
    finally:
        backend.close()
    assert result.status == Status.SUCCEEDED, result
    assert result.steps[0].stdout == f"{d.LOOPBACK_PACKET_BYTES}\n", result

"""Unix sockets two jobs could meet at to pass each other descriptors, and sockets that
outlive a job. Network jobs on L1/L2 share the host's network namespace, and with it
its abstract Unix sockets, which Landlock scopes to the job (sandbox_core/landlock.py);
a process job sees the host's files, where a world-writable directory was a meeting
point for any two jobs, so it makes socket files only in its own directories; and a
network job's sockets end with it (sweep.end_sockets). Docker's network jobs each have
a namespace of their own.

Each test first runs its attack unconfined, as another uid: the socket is reached, the
sockets outlive their process.
"""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox_core import JobResult, Status, landlock, parse_spec, sockdiag
from sandbox_core.backends.base import Backend
from tests.conftest import job_shared_dir, require
from tests.security.conftest import BACKENDS, bwrap_status, make_backend
from tests.security.helpers import backend_kind

SLOTS = (243, 244)  # two jobs at once, out of the other tests' way
BARE_UID = 60990  # the unconfined runs: no slot's uid, no account
# Connects to each abstract Unix socket named in TARGETS (comma-separated), saying who
# it is; prints each one's outcome; then one of its own, made and reached in the job.
REACHES = """
import errno, os, socket
for name in os.environ["TARGETS"].split(","):
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect("\\0" + name); s.sendall(os.environ["WHO"].encode()); print(name, "reached")
    except OSError as exc:
        print(name, errno.errorcode[exc.errno])
own = socket.socket(socket.AF_UNIX); own.bind("\\0" + os.environ["OWN"]); own.listen(1)
socket.socket(socket.AF_UNIX).connect("\\0" + os.environ["OWN"]); print("own reached")
"""
# Listens on an abstract Unix socket until a connection says "quit"; prints who came.
LISTENS = """
import os, socket
srv = socket.socket(socket.AF_UNIX); srv.bind("\\0" + os.environ["NAME"]); srv.listen(8)
srv.settimeout(60); came = []
while "quit" not in came:
    c, _ = srv.accept(); c.settimeout(5); came.append(c.recv(64).decode())
print(came)
"""
# Fills SOCKETS connections to PORT until each blocks, then closes them all: the kernel
# keeps sending what is queued (orphans). Prints its uid and the bytes it left queued.
LEAVES_ORPHANS = """
import os, socket
left = 0
for _ in range(int(os.environ["SOCKETS"])):
    c = socket.socket(); c.connect(("127.0.0.1", int(os.environ["PORT"]))); c.setblocking(False)
    try:
        while True:
            left += c.send(b"x" * 65536)
    except BlockingIOError:
        pass
    c.close()
print(os.getuid(), left)
"""


def _bare(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``code`` unconfined in the host's namespace, as BARE_UID (no sandbox)."""

    def drop() -> None:
        os.setgroups([])
        os.setresgid(BARE_UID, BARE_UID, BARE_UID)
        os.setresuid(BARE_UID, BARE_UID, BARE_UID)

    return subprocess.run(
        ["/usr/bin/python3", "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", **env},
        preexec_fn=drop,
        cwd="/",
    )


# the backends whose network jobs share the host's namespace (or the fake, in tests/meta)
SHARING = [param for param, (name, _) in BACKENDS.items() if name != "docker"]


@pytest.fixture(params=SHARING)
def network_backends(request: pytest.FixtureRequest) -> Iterator[list[Backend]]:
    """Two backends of one kind, each on a slot of its own, that let jobs have the host's
    network (the operator's opt-in)."""
    require(os.geteuid() == 0, "needs root: each job a uid of its own")
    name, options = BACKENDS[request.param]
    if name == "bwrap":
        ok, reason = bwrap_status()
        require(ok, reason)
    backends = [make_backend(name, **options, allow_network=True, slot=slot) for slot in SLOTS]
    yield backends
    for one in backends:
        one.close()


def _abstract_names() -> set[str]:
    """The abstract Unix sockets of the host's namespace (this process's)."""
    lines = Path("/proc/net/unix").read_text().splitlines()[1:]
    return {line.split()[-1][1:] for line in lines if line.split()[-1].startswith("@")}


def _run(backend: Backend, code: str, env: dict[str, str]) -> JobResult:
    limits = {"network": True, "timeout_s": 60}
    return backend.run(parse_spec({"code": code, "env": env, "limits": limits}))


def test_a_network_job_reaches_no_abstract_unix_socket_made_outside_it(network_backends):
    """Through one, two network jobs passed each other a TCP listener, whose connections
    then counted for neither (~207 MB, a review); the host's daemons listen on them too.
    A job still reaches the abstract sockets it makes itself."""
    require(landlock.scopes_abstract_unix(), landlock.why_unscoped() or "")
    tag = f"sandfarm-test-{os.getpid()}"
    host = socket.socket(socket.AF_UNIX)
    host.bind(f"\0{tag}-host")
    host.listen(8)
    listener_env = {"NAME": f"{tag}-job"}
    listened: dict[str, JobResult] = {}
    first = threading.Thread(
        target=lambda: listened.update(result=_run(network_backends[0], LISTENS, listener_env))
    )
    first.start()
    try:
        deadline = time.monotonic() + 30
        # (a job that ended, or never ran, makes none: no use waiting out the deadline)
        while f"{tag}-job" not in _abstract_names() and time.monotonic() < deadline:
            if not first.is_alive():
                break
            time.sleep(0.05)
        assert f"{tag}-job" in _abstract_names()  # the other job's socket is up
        targets = {"TARGETS": f"{tag}-host,{tag}-job", "OWN": f"{tag}-own"}
        control = _bare(REACHES, {**targets, "WHO": "control"})
        assert control.stdout.split("\n")[:2] == [f"{tag}-host reached", f"{tag}-job reached"]
        result = _run(network_backends[1], REACHES, {**targets, "WHO": "job", "OWN": f"{tag}-b"})
    finally:
        with socket.socket(socket.AF_UNIX) as quit_:
            quit_.connect(f"\0{tag}-job")
            quit_.sendall(b"quit")
        first.join(60)
        host.close()
    assert result.status == Status.SUCCEEDED, result
    assert result.steps[0].stdout.splitlines() == [
        f"{tag}-host EPERM",
        f"{tag}-job EPERM",
        "own reached",
    ], result.steps[0]
    other = listened["result"]
    assert other.status == Status.SUCCEEDED, other
    assert other.steps[0].stdout == "['control', 'quit']\n"  # the job never came


class Peer:
    """A server in the host's namespace that accepts and never reads: what is sent to it
    stays queued at the sender."""

    def __init__(self) -> None:
        self.server = socket.socket()
        self.server.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(64)
        self.port = self.server.getsockname()[1]
        self.held: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                self.held.append(self.server.accept()[0])
            except OSError:
                return

    def close(self) -> None:
        self.server.close()
        for one in self.held:
            one.close()


@pytest.fixture
def peer() -> Iterator[Peer]:
    one = Peer()
    yield one
    one.close()


def test_a_network_jobs_sockets_end_with_it(network_backends, peer):
    """A socket closed while it still sends lives on in the host's namespace, charged
    to the slot's group against its next job; one passed to another job holds what that
    one fills. Once the job ends, none of its uid's sockets is left."""
    env = {"SOCKETS": "8", "PORT": str(peer.port)}
    bare = _bare(LEAVES_ORPHANS, env)
    assert bare.returncode == 0, bare
    try:
        left = sockdiag.sockets_of(BARE_UID)
        assert len(left) >= 8, left  # they outlived their process, holding what it sent
    finally:
        sockdiag.end_sockets_of(BARE_UID)
    result = _run(network_backends[0], LEAVES_ORPHANS, env)
    assert result.status == Status.SUCCEEDED, result
    uid, queued = (int(word) for word in result.steps[0].stdout.split())
    assert queued > 8 * 4096, queued  # it left data queued, to a peer that never reads
    assert sockdiag.sockets_of(uid) == []  # none outlived its job


# Sends SEND bytes to PORT with room for all of them in its socket, and exits at once;
# prints its uid and how many bytes it left unsent or unacknowledged as it did.
SENDS_AND_EXITS = """
import fcntl, os, socket, struct, termios
c = socket.socket(); c.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 22)
c.connect(("127.0.0.1", int(os.environ["PORT"]))); c.sendall(b"x" * int(os.environ["SEND"]))
print(os.getuid(), struct.unpack("i", fcntl.ioctl(c, termios.TIOCOUTQ, b"\\0" * 4))[0])
"""


def test_what_a_network_job_sent_as_it_ended_reaches_its_peer(network_backends):
    """Ending a network job's sockets as its step ends dropped what it had sent and its
    peer had not yet taken, and reset the peer: a program that writes and exits lost
    its last data. Those still sending now go on for up to SOCKET_DRAIN_S first."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    got: dict[str, object] = {}

    def slow_peer() -> None:  # takes nothing for 0.3 s, then reads to the end
        conn, _ = server.accept()
        got["connected"] = True
        time.sleep(0.3)
        total = 0
        try:
            while data := conn.recv(65536):
                total += len(data)
            got["end"] = "eof"
        except ConnectionResetError:
            got["end"] = "reset"
        got["total"] = total
        conn.close()

    reader = threading.Thread(target=slow_peer, daemon=True)
    reader.start()
    send = 2 << 20
    env = {"PORT": str(server.getsockname()[1]), "SEND": str(send)}
    try:
        result = _run(network_backends[0], SENDS_AND_EXITS, env)
        # the job connected before it ended, if it ran: accepted at once then
        deadline = time.monotonic() + 5
        while "connected" not in got and time.monotonic() < deadline:
            time.sleep(0.05)
        reader.join(30 if "connected" in got else 0)
    finally:
        server.close()
    assert result.status == Status.SUCCEEDED, result
    uid, queued = (int(word) for word in result.steps[0].stdout.split())
    assert queued > send // 2, result.steps[0]  # still queued as it ended
    assert got == {"connected": True, "end": "eof", "total": send}, got
    assert sockdiag.sockets_of(uid) == []


def test_a_network_job_starts_and_its_sys_is_read_only(network_backends):
    """The host's namespace has no second sysfs (EBUSY): every network job on L1 failed
    to start. It runs now, with the host's sysfs bound read-only and no cgroup tree in
    view (bwrap gives a job no /sys at all)."""
    code = """
import os
mounts = [line.split() for line in open("/proc/self/mountinfo")]
sys_mounts = [m for m in mounts if m[4] == "/sys"]
print(bool(sys_mounts) and "ro" in sys_mounts[-1][5].split(","))  # the topmost
print(os.listdir("/sys/fs/cgroup") if os.path.isdir("/sys/fs/cgroup") else [])
print(os.path.isdir("/sys/class/net") or not os.path.isdir("/sys"))
"""
    result = _run(network_backends[0], code, {})
    assert result.status == Status.SUCCEEDED, result
    read_only, cgroups, net = result.steps[0].stdout.splitlines()
    assert cgroups == "[]" and net == "True"
    kind = backend_kind(network_backends[0])
    assert read_only == ("True" if kind == "process" else "False"), result.steps[0]


# Binds a Unix socket file in each directory of DIRS (colon-separated); prints each
# outcome.
BINDS = """
import errno, os, socket
for at in os.environ["DIRS"].split(":"):
    s = socket.socket(socket.AF_UNIX)
    try:
        s.bind(os.path.join(at, "meet")); print("bound")
    except OSError as exc:
        print(errno.errorcode[exc.errno])
"""


def test_a_job_makes_socket_files_only_in_its_own_directories(run, backend):
    """A world-writable host directory (a review found 13 a test had left, /var/crash
    and the like on other hosts) let two process jobs running at once meet at a socket
    file there and pass each other a TCP listener. The job still makes them in its
    workspace and its /tmp."""
    require(os.geteuid() == 0, "needs root: a uid of its own")
    shared = job_shared_dir("sandfarm-meet-")
    bare = _bare(BINDS, {"DIRS": str(shared)})
    assert bare.stdout == "bound\n", bare  # the control: there, any uid makes one
    assert stat.S_ISSOCK((shared / "meet").lstat().st_mode)  # for any other to connect
    (shared / "meet").unlink()
    result = run(code=BINDS, env={"DIRS": f"{shared}:.:/tmp"})
    assert result.status == Status.SUCCEEDED, result
    there, workspace, tmp = result.steps[0].stdout.split()
    # refused on the process backend; elsewhere the directory is not in its view at all
    expected = "EACCES" if backend_kind(backend) == "process" else "ENOENT"
    assert (there, workspace, tmp) == (expected, "bound", "bound"), result.steps[0]
    assert list(shared.iterdir()) == []
    # files still move across directories (Landlock refused that at first: git mv failed)
    moves = (
        "import os\nos.makedirs('x/y'); os.makedirs('/tmp/y/z')\n"
        "open('x/f', 'w').close(); os.rename('x/f', 'f'); os.link('f', 'x/y/f')\n"
        "os.rename('x/y', 'y'); os.rename('/tmp/y/z', '/tmp/z'); print('moved')\n"
    )
    moved = run(code=moves)
    assert moved.steps[0].stdout == "moved\n", moved

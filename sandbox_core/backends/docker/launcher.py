"""A warm container's first step, started ahead (the armed launcher).

`docker exec` costs ~60 ms before the step's first instruction (the engine, the shim,
runc joining the container). A warm container pays it while it waits in the pool: the
filler execs this launcher as the slot's uid with stdin attached, and waits for its
ready byte. The job's first step is then one write on that exec's stream: argv and
environment, length-prefixed, then the step's stdin; the launcher execs the step in
place. The step is the exec docker set up (same uid, groups, capabilities, seccomp
filter, no_new_privs, rlimits, cgroup, cwd and pid), so nothing of its confinement
depends on the launcher: it only chooses the program, as exec_create would.

What the launcher could leave behind, it restores: Python's ignored SIGPIPE and SIGXFSZ
go back to default, a step without stdin gets /dev/null, and the environment is the one
docker gave the exec (/proc/self/environ, before Python's locale coercion) plus the
step's, as exec_create merges them. Its descriptors are close-on-exec.

Who could reach it: nothing but the farm writes to its stdin (the worker's socket to the
engine); its uid is the slot's in the Docker range, which no host job uses, and the
slot's jobs run in other containers (pid namespaces); it is not dumpable while it waits
(no /proc/<pid>/fd for anyone but root; execve makes the step dumpable again, as cold).
It acks the message just before execve: no ack, nothing ran. A stream that ends first
means it died waiting, and the step goes to a plain exec; one that stays silent means
it may still hold the message, and the container is killed rather than run it twice.
"""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import time
from dataclasses import dataclass
from typing import Any

from sandbox_core.backends.docker.containers import WORKSPACE
from sandbox_core.backends.docker.stream import STDOUT, FrameDemux

READY, ACK = b"R", b"A"
READY_WAIT_S = 15.0
# The launcher is awake in a blocking read: its ack comes in milliseconds, or never.
ACK_WAIT_S = 5.0
# The kernel's own bound on argv + environment is below this.
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
# A cold step's exec carries at most this much argv and environment; a larger step
# goes through a launcher armed for it (session.py: dockerd keeps each exec's for minutes).
EXEC_INLINE_BYTES = 8 * 1024


def exec_payload_bytes(argv: list[str], env: dict[str, str]) -> int:
    """What an exec of ``argv`` with ``env`` hands the engine, in bytes."""
    args = sum(len(a.encode(errors="surrogatepass")) + 1 for a in argv)
    return args + sum(
        len(k.encode()) + len(v.encode(errors="surrogatepass")) + 2 for k, v in env.items()
    )


SOURCE = r"""
import ctypes, os, signal, sys
with open("/proc/self/environ", "rb") as given:
    environ = given.read()
ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: no /proc/<pid>/fd/0 for others
def read(n):
    data = bytearray()
    while len(data) < n:
        chunk = os.read(0, n - len(data))
        if not chunk:
            os._exit(0)  # the farm hung up: there is nothing to run
        data += chunk
    return bytes(data)
os.write(1, b"R")
size = int.from_bytes(read(8), "big")
if size > __MAX_MESSAGE_BYTES__:
    os._exit(125)
import json
message = json.loads(read(size))
env = dict(v.split(b"=", 1) for v in environ.split(b"\0") if b"=" in v)
env.update((k.encode(), v.encode()) for k, v in message["env"].items())
if not message["stdin"]:  # as a cold exec without stdin
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
for sig in (signal.SIGPIPE, signal.SIGXFSZ):
    signal.signal(sig, signal.SIG_DFL)
argv = message["argv"]
os.write(1, b"A")  # the step runs now (no ack: nothing ran)
try:
    os.execvpe(argv[0], argv, env)
except OSError as exc:
    sys.stderr.write(f"sandfarm: cannot run {argv[0]}: {exc.strerror}\n")
    sys.stderr.flush()
    os._exit(127 if isinstance(exc, FileNotFoundError) else 126)
""".replace("__MAX_MESSAGE_BYTES__", str(MAX_MESSAGE_BYTES))


class LauncherGone(OSError):
    """The launcher's stream ended before its ack: it died waiting, and nothing ran."""


@dataclass
class Launcher:
    """An armed launcher: its exec and the open stream to it."""

    exec_id: str
    sock: socket.socket

    def start(self, argv: list[str], env: dict[str, str], stdin: bytes | None) -> bytes:
        """Run ``argv`` in place of the launcher; returns the frames that came with its
        ack (the step's first output, re-framed) for the caller's demultiplexer. Raises
        LauncherGone when it was dead (nothing ran), another OSError when it did not
        answer (it may still hold the message: the caller must not run the step beside
        it). The caller feeds stdin (feed_stdin) once it returns."""
        message = json.dumps({"argv": argv, "env": env, "stdin": stdin is not None}).encode()
        if len(message) > MAX_MESSAGE_BYTES:
            raise LauncherGone("the step's argv and environment are too large for it")
        self.sock.settimeout(ACK_WAIT_S)
        try:
            self.sock.sendall(struct.pack(">Q", len(message)) + message)
        except OSError as exc:  # nothing read all of it: nothing ran
            raise LauncherGone(str(exc)) from None
        return _await_ack(self.sock)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


def feed_stdin(sock: socket.socket, stdin: bytes | None, deadline: float) -> None:
    """Send a step's stdin, then EOF, within the job's deadline (time.monotonic()): a step
    that reads none of it cannot hold the worker past it."""
    previous = sock.gettimeout()
    with contextlib.suppress(OSError):
        if stdin:
            sock.settimeout(max(0.05, deadline - time.monotonic()))
            sock.sendall(stdin)
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_WR)
    with contextlib.suppress(OSError):
        sock.settimeout(previous)


def _read_exact(sock: socket.socket, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise LauncherGone("the launcher's stream ended before its ack")
        data += chunk
    return bytes(data)


def _await_ack(sock: socket.socket) -> bytes:
    """Read frames up to the launcher's ack byte, the first byte it writes on stdout after
    its ready byte; returns what came before or with it, re-framed. Reads no byte past
    the ack's frame header and its first byte, so the rest stays for the pump."""
    kept = bytearray()
    while True:
        header = _read_exact(sock, 8)
        (size,) = struct.unpack_from(">I", header, 4)
        if header[0] != STDOUT:  # the step's stderr, racing the ack on the engine's side
            kept += header + _read_exact(sock, size)
            continue
        if size == 0:
            continue
        if _read_exact(sock, 1) != ACK:
            raise OSError("the launcher wrote something other than its ack")
        if size > 1:  # the step's first output, in the same frame
            kept += bytes(header[:4]) + struct.pack(">I", size - 1)
        return bytes(kept)


def arm(api: Any, container_id: str, uid: int) -> Launcher | None:
    """Start the launcher in a running container; None where it did not come up (no
    python3 in the image, an engine error): the container then runs its steps by exec."""
    try:
        exec_id = api.exec_create(
            container_id,
            ["python3", "-I", "-S", "-c", SOURCE],
            stdin=True,
            user=f"{uid}:{uid}",
            workdir=WORKSPACE,
        )["Id"]
        sock = api.exec_start(exec_id, socket=True)._sock
    except Exception:  # the SDK raises several unrelated types
        return None
    launcher = Launcher(exec_id, sock)
    if _ready(sock):
        return launcher
    launcher.close()
    return None


def _ready(sock: socket.socket) -> bool:
    """True once the launcher's ready byte, and nothing else, has come on its stdout."""
    demux = FrameDemux()
    previous = sock.gettimeout()
    try:
        sock.settimeout(READY_WAIT_S)
        while True:
            chunk = sock.recv(64)
            if not chunk:
                return False
            frames = demux.feed(chunk)
            if frames:
                return frames == [(STDOUT, READY)] and not demux.pending
    except OSError:
        return False
    finally:
        with contextlib.suppress(OSError):
            sock.settimeout(previous)

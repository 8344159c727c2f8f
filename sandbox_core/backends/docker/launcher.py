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
go back to default, and the environment is the one docker gave the exec
(/proc/self/environ, before Python's locale coercion) plus the step's, as exec_create
merges them. Its descriptors are close-on-exec. Nothing but the farm writes to its
stdin: the stream is the worker's socket to the engine.
"""

from __future__ import annotations

import contextlib
import json
import socket
import struct
from dataclasses import dataclass
from typing import Any

from sandbox_core.backends.docker.containers import WORKSPACE
from sandbox_core.backends.docker.stream import FrameDemux

READY = b"R"
READY_WAIT_S = 15.0
# The kernel's own bound on argv + environment is below this.
MAX_MESSAGE_BYTES = 16 * 1024 * 1024

SOURCE = r"""
import os, signal, sys
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
with open("/proc/self/environ", "rb") as given:
    env = dict(v.split(b"=", 1) for v in given.read().split(b"\0") if b"=" in v)
env.update((k.encode(), v.encode()) for k, v in message["env"].items())
for sig in (signal.SIGPIPE, signal.SIGXFSZ):
    signal.signal(sig, signal.SIG_DFL)
argv = message["argv"]
try:
    os.execvpe(argv[0], argv, env)
except OSError as exc:
    sys.stderr.write(f"sandfarm: cannot run {argv[0]}: {exc.strerror}\n")
    sys.stderr.flush()
    os._exit(127 if isinstance(exc, FileNotFoundError) else 126)
""".replace("__MAX_MESSAGE_BYTES__", str(MAX_MESSAGE_BYTES))


@dataclass
class Launcher:
    """An armed launcher: its exec and the open stream to it."""

    exec_id: str
    sock: socket.socket

    def start(self, argv: list[str], env: dict[str, str], stdin: bytes | None) -> None:
        """Run ``argv`` in place of the launcher, then feed it ``stdin`` (EOF either way)."""
        message = json.dumps({"argv": argv, "env": env}).encode()
        if len(message) > MAX_MESSAGE_BYTES:
            raise OSError("the step's argv and environment are too large")
        self.sock.sendall(struct.pack(">Q", len(message)) + message)
        with contextlib.suppress(OSError):
            if stdin:
                self.sock.sendall(stdin)
            self.sock.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


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
    try:
        sock.settimeout(READY_WAIT_S)
        while True:
            chunk = sock.recv(64)
            if not chunk:
                return False
            frames = demux.feed(chunk)
            if frames:
                return frames == [(1, READY)] and not demux.pending
    except OSError:
        return False
    finally:
        with contextlib.suppress(OSError):
            sock.settimeout(None)

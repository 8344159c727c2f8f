"""Host-side checks: the attack ran (the positive control), it failed, and the host is intact.

Every security test first proves its attack really ran and could have worked (the daemon
was alive, the secret was really there to steal, the listener was reachable from where
the job would be without the defence, the bomb reached the cap), then that it failed."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SANDBOX_IMAGE = "sandfarm/sandbox:latest"
NOBODY = 65534  # an unprivileged host uid outside every sandbox (the controls' attacker)


def new_marker() -> str:
    return f"sandfarm-marker-{uuid.uuid4().hex[:12]}"


def shell_split(marker: str) -> str:
    """``marker`` for a shell command line: the shell joins it back into one word, so the
    whole marker shows in the command line of the process it names, never in that of the
    shell (docker runs a step as ``bash -c COMMAND``)."""
    return f'{marker[:10]}""{marker[10:]}'


def backend_kind(backend: Any) -> str:
    """process, bwrap or docker: the backend (or the one a fake stands in for)."""
    return str(getattr(backend, "imitates", backend.name))


def _status_fields(pid: int | str) -> dict[str, str]:
    text = Path(f"/proc/{pid}/status").read_text()
    return dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)


def pids_with_marker(marker: str) -> list[int]:
    """Host pids whose command line contains ``marker`` (sees every namespace)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            if marker.encode() not in cmdline:
                continue
            state = _status_fields(entry.name).get("State", "")
        except OSError:
            continue
        if "zombie" not in state:
            found.append(int(entry.name))
    return found


def wait_gone(marker: str, timeout_s: float = 2.0) -> list[int]:
    """Pids still alive with ``marker`` after up to ``timeout_s`` (expected: none)."""
    deadline = time.monotonic() + timeout_s
    while (alive := pids_with_marker(marker)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive


def pid_alive(pid: int) -> bool:
    """Is host pid ``pid`` a live (not zombie) process?"""
    try:
        return "zombie" not in _status_fields(pid).get("State", "")
    except OSError:
        return False


def self_alive() -> bool:
    os.kill(os.getpid(), 0)
    return True


def uid_of(pid: int) -> int | None:
    try:
        return int(_status_fields(pid)["Uid"].split()[0])
    except (OSError, KeyError, ValueError):
        return None


# --- watching a job from the host while it runs ---------------------------------------


@dataclass
class Watched:
    """What the host saw of a marker's processes while a job ran."""

    pids: set[int] = field(default_factory=set)  # every live pid ever seen
    peak: int = 0  # most live at once
    peak_of_uid: int = 0  # most processes of the job's uid at once, zombies included
    samples: int = 0
    uids: set[int] = field(default_factory=set)


def run_watching(
    job: Callable[[], Any], marker: str, interval_s: float = 0.01, count_uid: bool = False
) -> tuple[Any, Watched]:
    """Run ``job`` in a thread; meanwhile sample the host's /proc for ``marker``. Returns
    the job's result and what was seen (the positive control: the attack's processes
    really existed). The watch ends when the job does, so it costs nothing when the job
    never runs anything."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["result"] = job()
        except BaseException as exc:  # re-raised in the test's thread
            box["error"] = exc

    watched = Watched()
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    while True:
        running = thread.is_alive()
        live = pids_with_marker(marker)
        watched.samples += 1
        watched.pids.update(live)
        watched.peak = max(watched.peak, len(live))
        for pid in live:
            # uid 0: a cold step's helper, root until its drop, carries the job's argv
            # (and so the marker); it is the farm's, not the job's uid
            if (uid := uid_of(pid)) is not None and uid != 0:
                watched.uids.add(uid)
        if count_uid and watched.uids:  # what RLIMIT_NPROC counts: zombies hold one too
            of_uid = sum(len(host_processes_of(uid)) for uid in watched.uids)
            watched.peak_of_uid = max(watched.peak_of_uid, of_uid)
        if not running:
            break
        time.sleep(interval_s)
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["result"], watched


def wait_until(
    condition: Callable[[], Any], while_alive: threading.Thread, timeout_s: float
) -> Any:
    """Poll ``condition`` until it holds, ``timeout_s`` passes, or ``while_alive`` ends
    (the job that would make it hold is over: no point waiting on)."""
    deadline = time.monotonic() + timeout_s
    while not (found := condition()) and time.monotonic() < deadline:
        if not while_alive.is_alive():
            return condition()
        time.sleep(0.02)
    return found


# --- listeners a job would reach without the network defence --------------------------


class Listener:
    """A TCP listener that counts who connected: the target of a network attack."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.sock = socket.create_server((host, 0))
        self.sock.settimeout(0.1)
        self.host, self.port = self.sock.getsockname()[:2]
        self.peers: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, peer = self.sock.accept()
            except (TimeoutError, OSError):
                continue
            self.peers.append(peer[0])
            conn.close()

    def accepted(self, settle_s: float = 0.2) -> int:
        time.sleep(settle_s)  # a connection the kernel completed is accepted within this
        return len(self.peers)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self.sock.close()

    def __enter__(self) -> Listener:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def connects(host: str, port: int, timeout_s: float = 2.0) -> bool:
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
        return True
    except OSError:
        return False


def connects_as(uid: int, host: str, port: int) -> bool:
    """Can an unprivileged host process (uid ``uid``, no sandbox) connect?"""
    code = f"import socket; socket.create_connection(({host!r}, {port}), timeout=2); print('OK')"
    done = subprocess.run(
        ["/usr/bin/python3", "-c", code], user=uid, group=uid, capture_output=True, text=True
    )
    return done.stdout.strip() == "OK"


def docker_client():
    import docker

    return docker.from_env(timeout=30)


def docker_bridge_gateway() -> str:
    """The host's address on Docker's default bridge: where a container WITH a network
    reaches the host (127.0.0.1 in a container is the container's own)."""
    bridge = docker_client().networks.get("bridge").attrs
    for config in bridge.get("IPAM", {}).get("Config") or []:
        if config.get("Gateway"):
            return str(config["Gateway"])
    name = bridge.get("Options", {}).get("com.docker.network.bridge.name", "docker0")
    shown = subprocess.run(
        ["ip", "-4", "-o", "addr", "show", "dev", name], capture_output=True, text=True
    ).stdout.split()
    if "inet" in shown:
        return shown[shown.index("inet") + 1].split("/")[0]
    subnet = ipaddress.ip_network(bridge["IPAM"]["Config"][0]["Subnet"])
    return str(next(subnet.hosts()))


def reachable_from_a_networked_container(host: str, port: int) -> bool:
    """Positive control of the docker network tests: a container on the default bridge
    (what a job would have without `network none`) connects to ``host:port``."""
    code = (
        "import socket\n"
        f"socket.create_connection(({host!r}, {port}), timeout=5).close()\n"
        "print('REACHED')\n"
    )
    out = docker_client().containers.run(
        SANDBOX_IMAGE, ["python3", "-c", code], network_mode="bridge", remove=True
    )
    return b"REACHED" in out


@contextlib.contextmanager
def holder_process(env: dict[str, str], uid: int | None = None) -> Iterator[int]:
    """A live host process with ``env`` as its environment (the plant of a secret-theft
    attack); its pid. Killed on exit."""
    proc = subprocess.Popen(
        ["/bin/sleep", "300"],
        env=env,
        user=uid,
        group=uid,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 5  # until it has exec'd: its own environment is shown
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                if Path(f"/proc/{proc.pid}/cmdline").read_bytes().startswith(b"/bin/sleep\0"):
                    break
            time.sleep(0.01)
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def host_processes_of(uid: int) -> list[str]:
    """'pid name state' of every host process of ``uid``, zombies included."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = _status_fields(entry.name)
        except OSError:
            continue
        if fields.get("Uid", "").split("\t")[0] == str(uid):
            found.append(f"{entry.name} {fields['Name']} {fields['State']}")
    return found

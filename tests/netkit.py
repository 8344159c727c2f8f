"""Hosts on a network, on one machine: network namespaces joined by veth pairs to a
bridge, so the farm runs across them exactly as across machines.

The bridge lives in a "switch" namespace of its own: the host's iptables (Docker sets
FORWARD to DROP) never see the hosts' traffic, and the host itself has no address on
the network. A host is a namespace with one link, ``eth0``, to the switch; a partition
is that link set down on the switch's side (the host sees no carrier, its peers see
silence: no RST, no ICMP, as with a pulled cable).

Names carry the pid of the test process that made them (``sfn<pid>-<role>``), so a run
that crashed leaves names a later run recognises and removes (their pid is gone), and
runs of other sessions on this machine are left alone.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
import redis

from tests.farmkit import Farm, wait_for

T = TypeVar("T")
PREFIX = "sfn"
SUBNET = "10.77.0"  # one /24: only the namespaces hold addresses in it
NAME_RE = re.compile(rf"^{PREFIX}(\d+)-")
LINK_RE = re.compile(rf"^{PREFIX}v(\d+)x\d+[ab]$")
CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done


def _enter(ns: str) -> None:
    """Move the calling thread (only it: the network namespace is per thread) into ns."""
    fd = os.open(f"/run/netns/{ns}", os.O_RDONLY)
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into {ns}")
    finally:
        os.close(fd)


def _pid_alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def kill_inside(ns: str) -> None:
    """SIGKILL what still runs in a namespace of ours (the fixtures stop theirs first)."""
    pids = ip("netns", "pids", ns, check=False).stdout.split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)


def remove_leftovers() -> list[str]:
    """Remove namespaces and links of earlier runs whose test process is gone."""
    removed = []
    for line in ip("netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        match = NAME_RE.match(name)
        if match and not _pid_alive(int(match.group(1))):
            kill_inside(name)
            ip("netns", "del", name, check=False)
            removed.append(name)
    for line in ip("-o", "link", "show", check=False).stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        match = LINK_RE.match(name)
        if match and not _pid_alive(int(match.group(1))):
            ip("link", "del", name, check=False)
            removed.append(name)
    return removed


@dataclass
class Host:
    """One machine of the network: a namespace with an address and a link to the switch."""

    role: str
    ns: str
    address: str
    link: str  # the switch's end of this host's cable
    switch: str
    pool: ThreadPoolExecutor = field(init=False)

    def __post_init__(self) -> None:
        self.pool = ThreadPoolExecutor(
            4, f"ns-{self.role}", initializer=_enter, initargs=(self.ns,)
        )

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run ``fn`` on this host: in a thread inside its namespace (threads it starts
        stay there; sockets it opens belong there)."""
        return self.pool.submit(fn, *args, **kwargs).result()

    def command(self, argv: list[str]) -> list[str]:
        # nsenter, not `ip netns exec`: that one mounts a fresh /sys, and the worker's
        # slot cgroups under /sys/fs/cgroup would be gone from its view
        return ["nsenter", f"--net=/run/netns/{self.ns}", "--", *argv]

    def popen(self, argv: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
        with open(log, "ab") as out:
            return subprocess.Popen(
                self.command(argv),
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )

    def link_down(self) -> None:
        ip("-n", self.switch, "link", "set", self.link, "down")

    def link_up(self) -> None:
        ip("-n", self.switch, "link", "set", self.link, "up")


class Network:
    """A switch and the hosts on it; ``close`` removes every namespace it made."""

    def __init__(self, roles: list[str]) -> None:
        self.tag = f"{PREFIX}{os.getpid()}"
        self.switch = f"{self.tag}-switch"
        self.hosts: dict[str, Host] = {}
        self._made: list[str] = []
        try:
            self._make(roles)
        except BaseException:
            self.close()
            raise

    def _netns(self, name: str) -> None:
        ip("netns", "del", name, check=False)  # this pid's own earlier network
        ip("netns", "add", name)
        self._made.append(name)
        ip("-n", name, "link", "set", "lo", "up")

    def _make(self, roles: list[str]) -> None:
        self._netns(self.switch)
        ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        ip("-n", self.switch, "link", "set", "br0", "up")
        for index, role in enumerate(roles, start=1):
            ns = f"{self.tag}-{role}"
            self._netns(ns)
            near, far = f"{PREFIX}v{os.getpid()}x{index}a", f"{PREFIX}v{os.getpid()}x{index}b"
            ip("link", "add", near, "type", "veth", "peer", "name", far)
            ip("link", "set", near, "netns", self.switch)
            ip("link", "set", far, "netns", ns)
            ip("-n", ns, "link", "set", far, "name", "eth0")
            address = f"{SUBNET}.{index}"
            ip("-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
            ip("-n", ns, "link", "set", "eth0", "up")
            ip("-n", self.switch, "link", "set", near, "master", "br0")
            ip("-n", self.switch, "link", "set", near, "up")
            self.hosts[role] = Host(role, ns, address, near, self.switch)

    def __getitem__(self, role: str) -> Host:
        return self.hosts[role]

    def close(self) -> None:
        for host in self.hosts.values():
            host.pool.shutdown(wait=False, cancel_futures=True)
        for ns in reversed(self._made):
            kill_inside(ns)
            ip("netns", "del", ns, check=False)
        self._made.clear()


class RedisHost:
    """A redis-server on a host of the network: AOF on (fsync every second, as
    ops/start_redis.sh runs it), its own data dir, restartable on the same address."""

    def __init__(self, host: Host, tmp: Path, port: int = 6379, *extra: str) -> None:
        self.host = host
        self.port = port
        self.dir = tmp / f"redis-{host.role}-{port}"
        self.dir.mkdir(mode=0o700, exist_ok=True)
        self.extra = list(extra)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://{self.host.address}:{self.port}/0"

    def start(self) -> None:
        argv = ["redis-server", "--bind", self.host.address, "--port", str(self.port)]
        argv += ["--appendonly", "yes", "--appendfsync", "everysec", "--save", ""]
        argv += ["--dir", str(self.dir), "--protected-mode", "no", *self.extra]
        self.proc = self.host.popen(argv, self.dir / "redis.log", dict(os.environ))
        client = self.host.call(redis.Redis, host=self.host.address, port=self.port)

        def up() -> bool:
            try:
                return bool(self.host.call(client.ping))
            except redis.RedisError:
                return False

        wait_for(up, 15, 0.05, f"redis-server on {self.host.role}")

    def synced(self) -> bool:
        """A replica holds its primary's data: the link is up and the first full copy is
        done. Until then a failover promotes an empty Redis (Redis 7 starts a replica's
        diskless sync 5 s after it connects)."""

        def info() -> dict[str, Any]:
            client = redis.Redis(host=self.host.address, port=self.port)
            try:
                return client.info("replication")
            finally:
                client.close()

        state = self.host.call(info)
        return state.get("master_link_status") == "up" and not state.get("master_sync_in_progress")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.kill()


def start_worker_on(farm: Farm, host: Host, name: str, concurrency: int = 2) -> Any:
    """A real `sandfarm worker` on ``host`` (farmkit's worker, launched in its namespace)."""
    return farm.start_worker(name, concurrency, launcher=host.command([]))


def require_netns(is_root: bool) -> None:
    from tests.conftest import require

    require(is_root, "network namespaces need root")
    require(shutil.which("ip") is not None, "the `ip` tool (iproute2) is missing")


@contextlib.contextmanager
def network(roles: list[str]) -> Iterator[Network]:
    remove_leftovers()
    net = Network(roles)
    try:
        yield net
    finally:
        net.close()


@pytest.fixture
def hosts(is_root: bool) -> Iterator[Network]:
    """broker, two worker hosts and a client, on one switch; removed afterwards."""
    require_netns(is_root)
    with network(["broker", "w1", "w2", "client"]) as net:
        yield net


class SentinelHost:
    """A redis-sentinel on a host, watching the primary ``master`` (quorum 2): it takes
    the primary down after 1 s of silence."""

    def __init__(self, host: Host, tmp: Path, primary: RedisHost, master: str = "farm") -> None:
        self.host = host
        self.port = 26379
        self.dir = tmp / f"sentinel-{host.role}"
        self.dir.mkdir(mode=0o700, exist_ok=True)
        self.master = master
        self.conf = self.dir / "sentinel.conf"  # sentinel rewrites it: its own copy
        self.conf.write_text(
            f"port {self.port}\nbind {host.address}\nprotected-mode no\ndir {self.dir}\n"
            f"sentinel monitor {master} {primary.host.address} {primary.port} 2\n"
            f"sentinel down-after-milliseconds {master} 1000\n"
            f"sentinel failover-timeout {master} 10000\n"
            f"sentinel parallel-syncs {master} 1\n"
        )
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"{self.host.address}:{self.port}"

    def start(self) -> None:
        argv = ["redis-sentinel", str(self.conf)]
        self.proc = self.host.popen(argv, self.dir / "sentinel.log", dict(os.environ))

    def ask(self, method: str, *args: Any) -> Any:
        """Call redis-py's ``method`` (``sentinel_master`` ...) on this sentinel."""

        def go() -> Any:
            client = redis.Redis(host=self.host.address, port=self.port, socket_timeout=2)
            try:
                return getattr(client, method)(*args)
            finally:
                client.close()

        return self.host.call(go)

    def primary(self) -> str | None:
        """host:port of the primary this sentinel names now."""
        try:
            host, port = self.ask("sentinel_get_master_addr_by_name", self.master)
        except (redis.RedisError, TypeError):
            return None
        return f"{host.decode() if isinstance(host, bytes) else host}:{port}"

    def ready(self) -> bool:
        """It knows the other two sentinels and a replica: a failover could happen."""
        try:
            info = self.ask("sentinel_master", self.master)
        except redis.RedisError:
            return False
        return info.get("num-other-sentinels") == 2 and info.get("num-slaves") == 1

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

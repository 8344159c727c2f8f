"""A private redis-server for tests that restart, kill or fill their broker."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import redis

from tests.farmkit import free_port, wait_for


class RedisServer:
    """A private redis-server with AOF (fsync always), restartable on the same port/dir."""

    def __init__(self, tmp: Path) -> None:
        self.port = free_port()
        self.dir = tmp / "redis"
        self.dir.mkdir()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--save",
                "",
                "--dir",
                str(self.dir),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis.from_url(self.url, socket_connect_timeout=0.5)

        def up() -> bool:
            try:
                return bool(client.ping())
            except redis.RedisError:
                return False

        wait_for(up, 10, 0.05, "redis-server up")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)


@contextmanager
def private_redis(tmp: Path) -> Iterator[RedisServer]:
    """A started RedisServer, killed at the end (skipped, or failed under CI=true,
    without redis-server)."""
    from tests.conftest import require

    require(shutil.which("redis-server") is not None, "redis-server is not installed")
    server = RedisServer(tmp)
    server.start()
    try:
        yield server
    finally:
        if server.proc is not None and server.proc.poll() is None:
            server.kill()


def oom_errors(client: redis.Redis) -> int:
    """Writes Redis refused as over its maxmemory (noeviction), since it started."""
    stat = client.info("errorstats").get("errorstat_OOM") or {}
    return int(stat.get("count", 0)) if isinstance(stat, dict) else 0


def fill(client: redis.Redis) -> None:
    """Redis over its maxmemory from now on (noeviction): every write that adds is refused."""
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", 1)

"""Shared test plumbing. A missing service skips locally but fails under CI=true."""

from __future__ import annotations

import os
import signal
import tempfile
from pathlib import Path

import pytest

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

# A suite started in the background (`cmd &` in a script, nohup) inherits SIGINT
# ignored, and so would every CLI the tests Ctrl-C: a handler of our own (unlike an
# ignored signal) is reset to the default in the children they exec.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# The compose stack's tests bring the whole farm up in containers: only `make test-stack`
# (SANDFARM_TEST_STACK=1) collects them, never a plain `make test`.
collect_ignore = [] if os.environ.get("SANDFARM_TEST_STACK") == "1" else ["stack"]


def require(condition: bool, reason: str) -> None:
    """Skip (locally) or fail (in CI) when a real service the test needs is missing."""
    if condition:
        return
    if IN_CI:
        pytest.fail(f"required service missing under CI=true: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def redis_url() -> str:
    import redis

    url = os.environ.get("SANDFARM_REDIS_URL", "redis://127.0.0.1:6379/0")
    try:
        redis.Redis.from_url(url, socket_connect_timeout=1).ping()
        ok = True
    except redis.RedisError:
        ok = False
    require(ok, f"no Redis answers at {url}")
    return url


@pytest.fixture(scope="session")
def is_root() -> bool:
    return os.geteuid() == 0


def redis_reachable(host: str = "127.0.0.1", port: int = 6379) -> bool:
    """Is there a Redis (the broker) on the host for a job to attack?"""
    import socket

    try:
        socket.create_connection((host, port), timeout=1).close()
        return True
    except OSError:
        return False


def job_shared_dir(prefix: str) -> Path:
    """A world-writable directory a test shares with its jobs. Not under /tmp: the process
    backend gives every job its own /tmp, /var/tmp and /dev/shm."""
    base = Path("/var/lib/sandfarm-tests")
    base.mkdir(mode=0o755, parents=True, exist_ok=True)
    base.chmod(0o755)  # whatever made it first (an older ops/start_redis.sh made it 0700)
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=base))
    path.chmod(0o777)
    return path

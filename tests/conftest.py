"""Shared test plumbing. A missing service skips locally but fails under CI=true."""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
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


# One suite at a time on a host: the suites share the Docker engine, the uid ranges, the
# reaper's view of containers and "nothing left behind" checks, so a second run beside a
# first (a background run still going when CI starts) breaks both. A subprocess suite
# (tests/meta) inherits the parent's hold through the environment.
SUITE_LOCK = Path(os.environ.get("SANDFARM_TEST_LOCK", "/tmp/sandfarm-test-suite.lock"))
SUITE_LOCK_HELD = "SANDFARM_TEST_LOCK_HELD"
SUITE_LOCK_WAIT_S = float(os.environ.get("SANDFARM_TEST_LOCK_WAIT_S", "3600"))


def pytest_configure(config: pytest.Config) -> None:
    """Wait for the suite lock; the descriptor stays open (held) until this process ends."""
    if os.environ.get(SUITE_LOCK_HELD) == "1":
        return
    try:  # read-only and 0644: a later run as another user can take it too
        fd = os.open(SUITE_LOCK, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as exc:  # another user's file (protected_regular), a symlink: no lock
        print(f"[tests] cannot open {SUITE_LOCK} ({exc}); running unlocked", file=sys.stderr)
        return
    deadline = time.monotonic() + SUITE_LOCK_WAIT_S
    told = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() > deadline:
                os.close(fd)
                pytest.exit(
                    f"another sandfarm test run held {SUITE_LOCK} for {SUITE_LOCK_WAIT_S:.0f} s", 3
                )
            if not told:
                print(
                    f"[tests] another sandfarm test run holds {SUITE_LOCK}; waiting",
                    file=sys.stderr,
                )
                told = True
            time.sleep(1)
    os.environ[SUITE_LOCK_HELD] = "1"


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


_JOB_SHARED_DIRS: list[Path] = []


def job_shared_dir(prefix: str) -> Path:
    """A world-writable directory a test shares with its jobs, removed when the session
    ends (left, it is a place where any two jobs meet: a review found 13). Not under
    /tmp: the process backend gives every job its own /tmp, /var/tmp and /dev/shm."""
    base = Path("/var/lib/sandfarm-tests")
    base.mkdir(mode=0o755, parents=True, exist_ok=True)
    base.chmod(0o755)  # whatever made it first (an older ops/start_redis.sh made it 0700)
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=base))
    path.chmod(0o777)
    _JOB_SHARED_DIRS.append(path)
    return path


@pytest.fixture(scope="session", autouse=True)
def _remove_job_shared_dirs() -> Iterator[None]:
    yield
    for path in _JOB_SHARED_DIRS:
        shutil.rmtree(path, ignore_errors=True)

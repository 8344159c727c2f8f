"""Plumbing for farm tests: a private Redis DB, real worker processes, process lookup.

Each test session claims a Redis DB (1..15) nobody else on this host holds (an flock
per DB number), flushes it, and flushes it again at the end; each farm in it gets its
own queue and key prefix. Workers are real `sandfarm worker` processes in their own
process group, stopped (and their reapers with them) by the fixture that started them.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis

from producer.client import FarmClient
from producer.protocol import Heartbeat, Settings
from sandbox_core import defaults as d
from sandbox_core.sweep import become_subreaper

SANDFARM = str(Path(sys.executable).parent / "sandfarm")
LOCK_DIR = Path(tempfile.gettempdir())


def with_db(url: str, db: int) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{db}", parts.query, parts.fragment))


@contextlib.contextmanager
def private_db(url: str):
    """Yield ``url`` pointed at a Redis DB this session alone uses; flushed before/after."""
    for db in range(15, 0, -1):
        fd = os.open(LOCK_DIR / f"sandfarm-test-redis-db-{db}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        db_url = with_db(url, db)
        client = redis.Redis.from_url(db_url)
        try:
            client.flushdb()
            yield db_url
        finally:
            with contextlib.suppress(redis.RedisError):
                client.flushdb()
            client.close()
            os.close(fd)
        return
    raise RuntimeError("no free Redis DB 1..15 for this test session")


def announce_worker(
    client: redis.Redis, settings: Settings, slots: int, name: str = "w", interval_s: float = 3600
) -> None:
    """A worker online by heartbeat alone: dispatch sees ``slots`` slots consuming the
    queue and moves jobs into it, where the test takes them (as a worker's BRPOP)."""
    beat = Heartbeat(
        pid=1,
        host="h",
        slots=(0, slots),
        uids=(None, None),
        concurrency=slots,
        queues=(settings.queue,),
        ts=time.time(),
        interval_s=interval_s,
    )
    client.hset(settings.keys.workers, name, beat.dump())


def children(pid: int) -> list[int]:
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry.name}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == pid:
            found.append(int(entry.name))
    return found


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def collect_once(client: FarmClient, ids: list[str], timeout: float, farm: Farm | None = None):
    """Every job's result, asserting none arrives twice and none is missing."""
    results = {}
    for result in client.as_completed(ids, timeout=timeout):
        assert result.id not in results, f"second result for {result.id}"
        results[result.id] = result
    assert set(results) == set(ids), farm.logs() if farm else sorted(set(ids) - set(results))
    return results


def not_a_subreaper() -> None:
    """Make this test process a worker's parent as a shell or init is in production: an
    in-process local backend made it a child subreaper, and a killed worker's orphans
    would then come here as zombies no one reaps (a slot's processes never "gone", its
    cgroup never empty); without the flag they go to init, which reaps them."""
    become_subreaper(enabled=False)


def wait_for(predicate, timeout: float, every: float = 0.05, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(every)


@dataclass
class Worker:
    name: str
    proc: subprocess.Popen
    log: Path
    farm: Farm

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_ready(self, timeout: float = 30.0) -> None:
        def ready() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"worker {self.name} exited:\n{self.log.read_text()}")
            return " ready." in self.log.read_text()

        wait_for(ready, timeout, 0.1, f"worker {self.name} ready")

    def reaper_pid(self) -> int | None:
        for pid in children(self.pid):
            if "worker.reaper" in cmdline(pid):
                return pid
        return None

    def pool_pids(self) -> list[int]:
        return [p for p in children(self.pid) if "worker.reaper" not in cmdline(p)]

    def slots(self) -> tuple[int, int]:
        """(first slot, count) from the worker's startup line."""
        for line in self.log.read_text().splitlines():
            if "sandfarm worker" in line and " slots " in line:
                lo, hi = line.split(" slots ")[1].split(",")[0].split("..")
                return int(lo), int(hi) - int(lo) + 1
        raise AssertionError("no slot line in the worker log")

    def uids(self) -> list[int]:
        lo, n = self.slots()
        return [d.SLOT_UID_BASE + i for i in range(lo, lo + n)]

    def kill_all(self) -> list[int]:
        """SIGKILL the main process and its pool children (not the reaper, own session)."""
        victims = [self.pid, *self.pool_pids()]
        os.killpg(self.pid, signal.SIGKILL)
        for pid in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.proc.wait(10)
        return victims

    def stop(self) -> None:
        reaper = self.reaper_pid()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.pid, signal.SIGKILL)
                self.proc.wait(10)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)  # pool children left behind
        if reaper is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(reaper, signal.SIGKILL)


@dataclass
class Farm:
    """One farm in the session's DB: its own queue and key prefix, its workers."""

    redis_url: str
    tmp: Path
    env: dict[str, str] = field(default_factory=dict)
    workers: list[Worker] = field(default_factory=list)
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:8])

    def __post_init__(self) -> None:
        self.env = {
            "SANDFARM_REDIS_URL": self.redis_url,
            "SANDFARM_QUEUE": f"q-{self.tag}",
            "SANDFARM_KEY_PREFIX": f"t-{self.tag}:",
            **self.env,
        }

    @property
    def settings(self) -> Settings:
        values = {k[len("SANDFARM_") :].lower(): v for k, v in self.env.items()}
        return Settings(**values)

    def client(self, **kwargs) -> FarmClient:
        return FarmClient(settings=self.settings, **kwargs)

    def start_worker(
        self,
        name: str,
        concurrency: int = 2,
        wait: bool = True,
        launcher: list[str] | None = None,
        **env: str,
    ) -> Worker:
        """A `sandfarm worker`; ``launcher`` runs it (``ip netns exec NS``: on a host)."""
        node = f"{name}-{self.tag}"
        log = self.tmp / f"{node}.log"
        not_a_subreaper()
        full_env = {**os.environ, **self.env, **env, "PYTHONUNBUFFERED": "1"}
        argv = [SANDFARM, "worker", "-c", str(concurrency), "-n", node, "-l", "info"]
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [*(launcher or []), *argv],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=full_env,
                start_new_session=True,
            )
        worker = Worker(f"{node}@{os.uname().nodename}", proc, log, self)
        self.workers.append(worker)
        if wait:
            worker.wait_ready()
        return worker

    def stop(self) -> None:
        for worker in self.workers:
            worker.stop()
        self.workers.clear()

    def logs(self) -> str:
        return "\n".join(f"=== {w.name}\n{w.log.read_text()[-4000:]}" for w in self.workers)

    def running_info(self, client: FarmClient, job_id: str) -> dict | None:
        raw = client.redis.get(client.keys.running(client.jobs.qid(job_id)))
        return json.loads(raw) if raw else None


# --- fixtures (import them into a test module) -----------------------------------------


@pytest.fixture(scope="module")
def farm_db(redis_url: str):
    with private_db(redis_url) as url:
        yield url


@pytest.fixture
def make_farm(farm_db: str, tmp_path: Path, is_root: bool):
    """Factory of farms; every worker they start is stopped at the end of the test."""
    from tests.conftest import require

    require(is_root, "the farm's sandbox slots need root (per-slot uids)")
    farms: list[Farm] = []

    def make(**env: str) -> Farm:
        farm = Farm(farm_db, tmp_path, env)
        farms.append(farm)
        return farm

    yield make
    for farm in farms:
        farm.stop()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def running_flower(farm: Farm) -> Iterator[str]:
    """`sandfarm flower --api` on a free loopback port, up and already receiving the
    farm's task events (it sees only events sent after it subscribed): its base URL."""
    import requests

    log = farm.tmp / "flower.log"
    with open(log, "wb") as out:
        flower = subprocess.Popen(
            [SANDFARM, "flower", "--port", str(port := free_port()), "--api"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **farm.env},
            start_new_session=True,
        )
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        assert flower.poll() is None, log.read_text()
        try:
            return bool(requests.get(f"{base}/healthcheck", timeout=2).ok)
        except requests.RequestException:
            return False

    try:
        wait_for(up, 30, 0.2, "flower up")
        with farm.client() as client:

            def listening() -> bool:
                probe = client.submit({"command": "true"})
                client.result(probe, timeout=10)
                time.sleep(0.5)
                tasks = requests.get(f"{base}/api/tasks", timeout=10).json()
                return client.jobs.qid(probe) in tasks  # Celery's task id: "tenant/id"

            wait_for(listening, 40, 0.1, "flower receiving events")
        yield base
    finally:
        os.killpg(flower.pid, signal.SIGTERM)
        flower.wait(10)


def module_farm(name: str, slots: int = 2) -> Any:
    """A module-scoped ``farm`` fixture: one worker named ``name`` with ``slots`` slots,
    in the session's DB (``farm_db``), stopped after the module."""

    @pytest.fixture(scope="module")
    def farm(farm_db: str, tmp_path_factory: Any, is_root: bool) -> Iterator[Farm]:
        from tests.conftest import require

        require(is_root, "the farm's sandbox slots need root (per-slot uids)")
        one = Farm(farm_db, tmp_path_factory.mktemp(name))
        try:
            one.start_worker(name, slots)
            yield one
        finally:
            one.stop()

    return farm

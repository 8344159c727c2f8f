"""The one task: ``sandfarm.execute`` — validate, count the attempt, run in this pool
process's slot, store the bounded JobResult once.

Message: ``args = [spec_dict, meta]`` where meta is ``{"id", "queued_at", "notify"}``
(``notify``: the completion list of the client that submitted it). The client has
already taken the job's state key, so a second submission never sends a second message;
a redelivered message (worker died, lost ack) finds the stored result and stops, or
runs again and loses the SET NX race, which is counted, never stored.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from datetime import UTC, datetime
from typing import Any

import redis
from celery import Task
from celery.exceptions import SoftTimeLimitExceeded
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from producer.settings import TASK_NAME
from producer.store import ResultStore
from sandbox_core import JobResult, SpecError, Status, get_backend, parse_spec
from sandbox_core import defaults as d
from sandbox_core.backends import Backend
from worker.app import app, settings, slot_index

# The running flag outlives the job's deadline by this much (slot wait, setup, storing).
RUNNING_MARGIN_S = 120.0

# KEYS: result, attempts, running, cancel, in-flight zset
# ARGV: ttl, running JSON, running ttl, job id, in-flight expiry, now (epoch seconds);
# entries past their expiry (jobs of killed workers) are dropped here and by status().
_BEGIN_LUA = """
if redis.call('EXISTS', KEYS[1]) == 1 then return {-1, 0} end
local attempts = redis.call('INCR', KEYS[2])
redis.call('EXPIRE', KEYS[2], ARGV[1])
redis.call('SET', KEYS[3], ARGV[2], 'EX', ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', ARGV[6])
redis.call('ZADD', KEYS[5], ARGV[5], ARGV[4])
return {attempts, redis.call('EXISTS', KEYS[4])}
"""

_client: redis.Redis | None = None
_begin_script: Any = None
_store: ResultStore | None = None
_backends: dict[str, Backend] = {}


def client() -> redis.Redis:
    """This process's Redis client; retries across a Redis restart of up to ~a minute."""
    global _client, _store, _begin_script
    if _client is None:
        _client = redis.Redis.from_url(
            settings.redis_url,
            retry=Retry(ExponentialBackoff(cap=2.0, base=0.05), retries=40),
            retry_on_error=[redis.ConnectionError, redis.TimeoutError],
            socket_timeout=30,
            socket_connect_timeout=5,
            health_check_interval=10,
        )
        _store = ResultStore(_client, settings)
        _begin_script = _client.register_script(_BEGIN_LUA)
    return _client


def store(result: JobResult, notify: str | None) -> bool:
    """First stored result wins; returns False (and counts it) for a duplicate."""
    client()
    assert _store is not None
    return _store.store(result, notify)


def backend_for(name: str, hostname: str | None) -> Backend:
    backend = _backends.get(name)
    if backend is None:
        options: dict[str, object] = {
            "worker": hostname,
            "allow_weaker": settings.allow_weaker,
            "allow_network": settings.allow_network,
        }
        if name in ("process", "bwrap"):
            options["slot"] = slot_index()
        if name == "docker":
            options.update(
                image=settings.docker_image,
                runtime=settings.docker_runtime,
                warm_pool=settings.docker_warm_pool,
            )
        backend = get_backend(name, **options)
        _backends[name] = backend
    return backend


def _timeout_of(spec: object) -> float:
    """The job's wall timeout, read before validation (bounded, default if unreadable)."""
    try:
        value = float(spec["limits"]["timeout_s"])  # type: ignore[index]
    except (KeyError, TypeError, ValueError):
        return d.TIMEOUT_S[0]
    return min(max(value, 1.0), d.TIMEOUT_S[1])


def _parse_time(value: object) -> datetime | None:
    if not isinstance(value, str):
        return None
    with contextlib.suppress(ValueError):
        return datetime.fromisoformat(value)
    return None


def _final(job_id: str, status: Status, message: str, **extra: Any) -> JobResult:
    now = datetime.now(UTC)
    result = JobResult(id=job_id, status=status, message=message, **extra)
    result.timings.finished_at = now
    return result


class CancelWatch:
    """Polls the job's cancel key and sets the event Backend.run watches."""

    def __init__(self, key: str, every: float) -> None:
        self.key = key
        self.every = every
        self.event = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cancel-watch", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            try:
                if client().exists(self.key):
                    self.event.set()
                    return
            except redis.RedisError:
                continue

    def __enter__(self) -> threading.Event:
        self._thread.start()
        return self.event

    def __exit__(self, *exc: object) -> None:
        self._stop.set()


class ExecuteTask(Task):
    # The code never goes to Flower or logs (the producer also sends argsrepr).
    def on_failure(self, exc, task_id, args, kwargs, einfo) -> None:
        """A farm failure (a bug, Celery's hard time limit): store `error` for the job."""
        meta = args[1] if len(args) > 1 and isinstance(args[1], dict) else {}
        job_id = meta.get("id")
        if not job_id:
            return
        with contextlib.suppress(Exception):
            store(
                _final(job_id, Status.ERROR, f"farm failure: {type(exc).__name__}: {exc}"),
                meta.get("notify"),
            )


@app.task(name=TASK_NAME, bind=True, base=ExecuteTask, acks_late=True, reject_on_worker_lost=True)
def execute(self: Task, spec: dict, meta: dict) -> str:
    job_id = str(meta["id"])
    notify = meta.get("notify")
    queued_at = _parse_time(meta.get("queued_at"))
    hostname = self.request.hostname
    keys = settings.keys
    client()
    ttl = settings.result_ttl_s

    # One atomic round trip: stop if final, else count the attempt, flag it running
    # (expiring soon after its deadline, so a killed pool process leaves no stale flag)
    # and list it in flight; and read the cancel flag after setting ours (see cancel()).
    deadline_in = _timeout_of(spec) + RUNNING_MARGIN_S
    running = json.dumps({"worker": hostname, "pid": os.getpid(), "slot": slot_index()})
    attempts, cancelled = _begin_script(
        keys=[
            keys.result(job_id),
            keys.attempts(job_id),
            keys.running(job_id),
            keys.cancel(job_id),
            keys.in_flight,
        ],
        args=[ttl, running, int(deadline_in), job_id, time.time() + deadline_in, time.time()],
    )
    if attempts < 0:
        # Redelivered after a result was stored (lost ack), or cancelled while queued.
        return "already final"
    common = {"worker": hostname, "attempts": attempts, "labels": {}}
    if isinstance(spec, dict) and isinstance(spec.get("labels"), dict):
        common["labels"] = {str(k): str(v) for k, v in list(spec["labels"].items())[:32]}

    if cancelled:
        store(_final(job_id, Status.CANCELLED, "cancelled before it ran", **common), notify)
        return "cancelled"
    if attempts > settings.max_attempts:
        message = f"job killed its worker {attempts - 1} times; not run again"
        store(_final(job_id, Status.ERROR, message, **common), notify)
        return "error"
    try:
        job = parse_spec(spec)
    except SpecError as exc:
        store(_final(job_id, Status.REJECTED, str(exc), **common), notify)
        return "rejected"
    job.id = job_id
    name = job.backend or settings.default_backend
    try:
        backend = backend_for(name, hostname)
    except Exception as exc:  # missing engine / module: the farm cannot run this backend
        message = f"backend {name} unavailable on {hostname}: {type(exc).__name__}: {exc}"
        store(_final(job_id, Status.ERROR, message, backend=name, **common), notify)
        return "error"

    try:
        with CancelWatch(keys.cancel(job_id), settings.cancel_poll_s) as cancel:
            result = backend.run(job, cancel=cancel, queued_at=queued_at)
    except SoftTimeLimitExceeded:
        message = "the farm's time limit passed before the sandbox ended the job"
        result = _final(job_id, Status.ERROR, message, backend=name, **common)
    result.id = job_id
    result.worker = hostname
    result.attempts = attempts
    stored = store(result, notify)
    return result.status.value if stored else "duplicate"

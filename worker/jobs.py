"""One job in this pool process's slot: from its message's spec and meta to a bounded
JobResult (validation, the attempt limit, the backend, cancellation), and the one-line
summary Flower and the log show. Storing it is the chain's step (worker/chain.py)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import redis
from celery.exceptions import SoftTimeLimitExceeded

from producer.protocol import FarmScripts, MessageMeta, connect
from producer.protocol.records import spec_hash
from sandbox_core import JobResult, SpecError, Status, get_backend, parse_spec
from sandbox_core import defaults as d
from sandbox_core.backends import Backend
from sandbox_core.backends.local import LocalBackend
from worker.app import settings, slot_index, spare_slot_index

_client: redis.Redis | None = None
_scripts: FarmScripts | None = None
_backends: dict[str, Backend] = {}


def client() -> redis.Redis:
    """This process's Redis client (patient: it rides out a Redis restart)."""
    global _client, _scripts
    if _client is None:
        _client = connect(settings.redis_url)
        _scripts = FarmScripts(_client, settings)
    return _client


def scripts() -> FarmScripts:
    client()
    assert _scripts is not None
    return _scripts


def close_backends() -> None:
    """A pool process that ends closes its local backends: their standbys go with their
    slots (the reaper's last sweep covers a process that could not)."""
    for backend in list(_backends.values()):
        if isinstance(backend, LocalBackend):
            with contextlib.suppress(Exception):
                backend.close()


def backend_for(name: str, hostname: str | None) -> Backend:
    backend = _backends.get(name)
    if backend is None:
        config = settings.backend_config(
            name, slot=slot_index(), spare_slot=spare_slot_index(), worker=hostname
        )
        backend = get_backend(config)
        _backends[name] = backend
    return backend


def timeout_of(spec: object) -> float:
    """The job's wall timeout, read before validation (bounded, default if unreadable)."""
    try:
        value = float(spec["limits"]["timeout_s"])  # type: ignore[index]
    except (KeyError, TypeError, ValueError):
        return d.TIMEOUT_S[0]
    return min(max(value, 1.0), d.TIMEOUT_S[1])


def spec_digest_of(spec: object) -> str:
    """The hash this job's submission wrote in its record (records.spec_hash): its
    result is stored only under a record of the same hash, never without one
    (lib_store.lua orphaned). '' for a spec that is no dict or no JSON (its result is
    stored unchecked)."""
    if not isinstance(spec, dict):
        return ""
    try:
        return spec_hash(spec)
    except (TypeError, ValueError):
        return ""


def final(job_id: str, status: Status, message: str, **extra: Any) -> JobResult:
    """A result the farm gives without running the job."""
    result = JobResult(id=job_id, status=status, message=message, **extra)
    result.timings.finished_at = datetime.now(UTC)
    return result


class CancelWatch:
    """One thread per process polls the cancel keys of the jobs it runs (one round trip
    for all of them) and sets the event Backend.run watches: no thread to start per job."""

    def __init__(self, every: float) -> None:
        self.every = every
        self._watched: dict[str, threading.Event] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    @contextlib.contextmanager
    def watching(self, key: str) -> Iterator[threading.Event]:
        event = threading.Event()
        with self._lock:
            self._watched[key] = event
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="cancel", daemon=True)
                self._thread.start()
        try:
            yield event
        finally:
            with self._lock:
                self._watched.pop(key, None)

    def _run(self) -> None:
        while True:
            time.sleep(self.every)
            with self._lock:
                watched = list(self._watched.items())
            if not watched:
                continue
            try:
                pipe = client().pipeline(transaction=False)
                for key, _ in watched:
                    pipe.exists(key)
                flags = pipe.execute()
            except redis.RedisError:
                continue
            for (_, event), flag in zip(watched, flags, strict=True):
                if flag:
                    event.set()


_cancels = CancelWatch(settings.cancel_poll_s)


@dataclass(frozen=True)
class Job:
    """A job this slot took: its message's spec and meta, and what begin said of it."""

    spec: Any  # the spec as sent: validated here, never trusted before
    meta: MessageMeta
    attempts: int
    cancelled: bool
    dispatched: float | None  # when dispatch moved it (epoch s), if known
    began: datetime
    argsrepr: str = ""  # what Flower shows of a chain's job (from its own message)


def run_job(job: Job, hostname: str | None) -> JobResult:
    """The job's final result (never raises for the job's own problems)."""
    spec, meta = job.spec, job.meta
    common: dict[str, Any] = {"worker": hostname, "attempts": job.attempts, "labels": {}}
    if isinstance(spec, dict) and isinstance(spec.get("labels"), dict):
        common["labels"] = {str(k): str(v) for k, v in list(spec["labels"].items())[:32]}
    if job.cancelled:
        return final(meta.id, Status.CANCELLED, "cancelled before it ran", **common)
    if job.attempts > settings.max_attempts:
        message = f"job killed its worker {job.attempts - 1} times; not run again"
        return final(meta.id, Status.ERROR, message, **common)
    try:
        parsed = parse_spec(spec)
    except SpecError as exc:
        return final(meta.id, Status.REJECTED, str(exc), **common)
    parsed.id = meta.id
    name = parsed.backend or settings.default_backend
    if name not in settings.served_backends:
        message = f"backend {name} is not served by {hostname} (it serves:"
        message += f" {', '.join(settings.served_backends)})"
        return final(meta.id, Status.REJECTED, message, backend=name, **common)
    try:
        backend = backend_for(name, hostname)
    except Exception as exc:  # missing engine / module: the farm cannot run this backend
        message = f"backend {name} unavailable on {hostname}: {type(exc).__name__}: {exc}"
        return final(meta.id, Status.ERROR, message, backend=name, **common)
    try:
        with _cancels.watching(settings.keys.cancel(meta.qid)) as cancel:
            result = backend.run(parsed, cancel=cancel, queued_at=meta.queued_at)
    except SoftTimeLimitExceeded:
        message = "the farm's time limit passed before the sandbox ended the job"
        result = final(meta.id, Status.ERROR, message, backend=name, **common)
    result.id = meta.id
    result.worker = hostname
    result.attempts = job.attempts
    if job.dispatched is not None and job.attempts == 1:  # a redelivery's wait is not dispatch's
        phases = result.timings.phases
        if meta.queued_at is not None:
            phases.dispatch_ms = max(0.0, (job.dispatched - meta.queued_at.timestamp()) * 1000)
        phases.delivery_ms = max(0.0, (job.began.timestamp() - job.dispatched) * 1000)
    return result


def summary(result: JobResult, stored: bool = True) -> str:
    """What happened, for Flower's result column and the worker log: "failed exit=1
    0.42s process" (never the output)."""
    codes = [s.exit_code for s in result.steps if s.exit_code not in (None, 0)]
    signals = [s.signal for s in result.steps if s.signal]
    parts = [result.status.value]
    if codes:
        parts.append(f"exit={codes[0]}")
    if signals:
        parts.append(f"signal={signals[0]}")
    if result.timings.run_ms is not None:
        parts.append(f"{result.timings.run_ms / 1000:.2f}s")
    parts.append(result.backend or "-")
    if not stored:
        parts.append("(not stored: a duplicate, or its id names other code now)")
    return " ".join(parts)

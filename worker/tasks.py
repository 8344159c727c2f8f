"""The one task: ``sandfarm.execute`` — validate, count the attempt, run in this pool
process's slot, store the bounded JobResult once.

Message: ``args = [spec_dict, meta]`` where meta is a ``protocol.MessageMeta`` (``notify``:
the completion list of the client that submitted it). The client has
already taken the job's state key, so a second submission never sends a second message;
a redelivered message (worker died, lost ack) finds the stored result and stops, or
runs again and loses the SET NX race, which is counted, never stored.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import redis
from celery import Task, signals
from celery.exceptions import SoftTimeLimitExceeded
from celery.worker.request import Request

from producer.protocol import TASK_NAME, FarmScripts, MessageMeta, RunningRecord, connect
from sandbox_core import JobResult, SpecError, Status, get_backend, parse_spec
from sandbox_core import defaults as d
from sandbox_core.backends import Backend
from sandbox_core.backends.local import LocalBackend
from worker.app import app, settings, slot_index

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


def store(result: JobResult, meta: MessageMeta) -> bool:
    """First stored result wins; returns False (and counts it) for a duplicate. A stored
    result of a tenant's job counts its usage and dispatches the next waiting job."""
    return scripts().store_result(result, meta.notify, meta.qid, meta.tenant, ttl=meta.ttl)


@signals.worker_process_shutdown.connect
def _close_backends(**_: object) -> None:
    """A pool process that ends closes its local backends: their standbys go with their
    slots (the reaper's last sweep covers a process that could not)."""
    for backend in list(_backends.values()):
        if isinstance(backend, LocalBackend):
            with contextlib.suppress(Exception):
                backend.close()


def backend_for(name: str, hostname: str | None) -> Backend:
    backend = _backends.get(name)
    if backend is None:
        config = settings.backend_config(name, slot=slot_index(), worker=hostname)
        backend = get_backend(config)
        _backends[name] = backend
    return backend


def _timeout_of(spec: object) -> float:
    """The job's wall timeout, read before validation (bounded, default if unreadable)."""
    try:
        value = float(spec["limits"]["timeout_s"])  # type: ignore[index]
    except (KeyError, TypeError, ValueError):
        return d.TIMEOUT_S[0]
    return min(max(value, 1.0), d.TIMEOUT_S[1])


def _final(job_id: str, status: Status, message: str, **extra: Any) -> JobResult:
    now = datetime.now(UTC)
    result = JobResult(id=job_id, status=status, message=message, **extra)
    result.timings.finished_at = now
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


def _meta_of(raw: object) -> MessageMeta | None:
    try:
        return MessageMeta.model_validate(raw)
    except ValueError:
        return None


class ExecuteRequest(Request):
    """Flower and the logs show the backend that runs a job, never "default"."""

    @property
    def argsrepr(self) -> str:
        text = str(super().argsrepr)
        return text.replace("backend=default", f"backend={settings.default_backend}", 1)


class ExecuteTask(Task):  # Celery's Task is untyped (Any)
    Request = ExecuteRequest

    # The code never goes to Flower or logs (the producer also sends argsrepr).
    def on_failure(
        self, exc: BaseException, task_id: str, args: Any, kwargs: Any, einfo: Any
    ) -> None:
        """A farm failure (a bug, Celery's hard time limit): store `error` for the job."""
        meta = _meta_of(args[1]) if len(args) > 1 else None
        if meta is None:
            return
        with contextlib.suppress(Exception):
            store(_final(meta.id, Status.ERROR, f"farm failure: {type(exc).__name__}: {exc}"), meta)


@app.task(name=TASK_NAME, bind=True, base=ExecuteTask, acks_late=True, reject_on_worker_lost=True)
def execute(self: Task, spec: dict[str, Any], raw_meta: dict[str, Any]) -> str:
    meta = MessageMeta.model_validate(raw_meta)
    job_id, queued_at = meta.id, meta.queued_at
    hostname = self.request.hostname
    keys = settings.keys

    # One atomic round trip (begin_attempt.lua): final already? else count, flag, list.
    running = RunningRecord(worker=hostname, pid=os.getpid(), slot=slot_index())
    began = datetime.now(UTC)
    attempts, cancelled, dispatched = scripts().begin_attempt(
        meta.qid, meta.tenant, running, _timeout_of(spec)
    )
    if attempts < 0:
        # Redelivered after a result was stored (lost ack), or cancelled while queued.
        return "already final"
    common = {"worker": hostname, "attempts": attempts, "labels": {}}
    if isinstance(spec, dict) and isinstance(spec.get("labels"), dict):
        common["labels"] = {str(k): str(v) for k, v in list(spec["labels"].items())[:32]}

    if cancelled:
        return summary(_final(job_id, Status.CANCELLED, "cancelled before it ran", **common), meta)
    if attempts > settings.max_attempts:
        message = f"job killed its worker {attempts - 1} times; not run again"
        return summary(_final(job_id, Status.ERROR, message, **common), meta)
    try:
        job = parse_spec(spec)
    except SpecError as exc:
        return summary(_final(job_id, Status.REJECTED, str(exc), **common), meta)
    job.id = job_id
    name = job.backend or settings.default_backend
    if name not in settings.served_backends:
        message = f"backend {name} is not served by {hostname} (it serves:"
        message += f" {', '.join(settings.served_backends)})"
        return summary(_final(job_id, Status.REJECTED, message, backend=name, **common), meta)
    try:
        backend = backend_for(name, hostname)
    except Exception as exc:  # missing engine / module: the farm cannot run this backend
        message = f"backend {name} unavailable on {hostname}: {type(exc).__name__}: {exc}"
        return summary(_final(job_id, Status.ERROR, message, backend=name, **common), meta)

    try:
        with _cancels.watching(keys.cancel(meta.qid)) as cancel:
            result = backend.run(job, cancel=cancel, queued_at=queued_at)
    except SoftTimeLimitExceeded:
        message = "the farm's time limit passed before the sandbox ended the job"
        result = _final(job_id, Status.ERROR, message, backend=name, **common)
    result.id = job_id
    result.worker = hostname
    result.attempts = attempts
    if dispatched is not None and attempts == 1:  # a redelivery's wait is not dispatch's
        phases = result.timings.phases
        if queued_at is not None:
            phases.dispatch_ms = max(0.0, (dispatched - queued_at.timestamp()) * 1000)
        phases.delivery_ms = max(0.0, (began.timestamp() - dispatched) * 1000)
    return summary(result, meta)


def summary(result: JobResult, meta: MessageMeta) -> str:
    """Store the result (first one wins) and say what happened, for Flower's result
    column and the worker log: "failed exit=1 0.42s process" (never the output)."""
    stored = store(result, meta)
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
        parts.append("(duplicate: not stored)")
    return " ".join(parts)

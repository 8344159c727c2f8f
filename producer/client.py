"""FarmClient: submit jobs to the farm and collect their results, in few Redis round trips.

- ``submit`` / ``submit_many``: the job's state key is taken with SET NX first, so the
  same job id submitted twice (by anyone, until its TTL) is sent once; messages go out
  by task name through kombu's pipelined publish batch.
- ``as_completed``: each job's worker pushes its id on this client's completion list
  when it stores the result; the client pops up to ``batch`` ids per call (BLMPOP) and
  fetches their results with one MGET, so N jobs cost O(N / batch) calls. Ids submitted
  elsewhere (another client, a resumed batch) are found by an MGET rescan when the list
  is idle.
- Results, job state, attempt counters and completion lists all carry a TTL.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime
from typing import Any

from celery import Celery

from producer.celery_app import make_app
from producer.protocol import (
    KOMBU_UNACKED,
    TASK_NAME,
    FarmScripts,
    Heartbeat,
    IdConflictError,
    JobState,
    MessageMeta,
    Settings,
    connect,
    get_settings,
    margins,
)
from producer.protocol.connection import redact
from producer.protocol.records import spec_hash
from producer.protocol.scripts import loads
from producer.waiting import WaitWatch
from sandbox_core import JobResult, JobSpec, Limits, Status, parse_spec

DEFAULT_BATCH = 1000
_DEFAULT_LIMITS = Limits().model_dump(mode="json")


def compact_spec(spec: JobSpec) -> dict[str, Any]:
    """The spec as a small JSON dict: defaults that need no saying are left out."""
    data = spec.model_dump(mode="json", exclude_none=True)
    for name in ("files", "env", "collect", "labels"):
        if not data.get(name):
            data.pop(name, None)
    if not data.get("stop_on_error"):
        data.pop("stop_on_error", None)
    limits = {k: v for k, v in data.get("limits", {}).items() if _DEFAULT_LIMITS.get(k) != v}
    if limits:
        data["limits"] = limits
    else:
        data.pop("limits", None)
    return data


class FarmClient:
    """The producer SDK. ``redis_url`` defaults to ``SANDFARM_REDIS_URL``."""

    def __init__(
        self,
        redis_url: str | None = None,
        *,
        settings: Settings | None = None,
        client_id: str | None = None,
    ) -> None:
        self.settings = settings or get_settings(redis_url=redis_url)
        if redis_url is not None and self.settings.redis_url != redis_url:
            self.settings = self.settings.model_copy(update={"redis_url": redis_url})
        self.keys = self.settings.keys
        # One completion list per client; pass a stable client_id to resume collection.
        self.client_id = client_id or uuid.uuid4().hex
        self.done_key = self.keys.done(self.client_id)
        self.redis = connect(self.settings.redis_url)
        self._scripts = FarmScripts(self.redis, self.settings)
        self._app: Celery | None = None

    # --- submission -------------------------------------------------------------------

    @property
    def celery(self) -> Celery:
        if self._app is None:
            self._app = make_app(self.settings)
        return self._app

    def submit(self, spec: JobSpec | dict[str, Any]) -> str:
        """Enqueue one job; returns its id. The same id again is not sent again."""
        return self.submit_many([spec])[0]

    def submit_many(
        self, specs: Iterable[JobSpec | dict[str, Any]], batch: int = DEFAULT_BATCH
    ) -> list[str]:
        """Enqueue many jobs, pipelined; returns their ids in order.

        A dict is validated first (SpecError names the field). An id already submitted
        (within the result TTL) with the same spec, or repeated in ``specs``, is returned
        but not sent again; an id taken by a different spec raises IdConflictError once
        the rest are sent (its ``submitted`` lists their ids).
        """
        ids: list[str] = []
        conflicts: list[str] = []
        chunk: list[JobSpec] = []
        for item in specs:
            spec = item if isinstance(item, JobSpec) else parse_spec(item)
            if spec.id is None:
                spec = spec.model_copy(update={"id": uuid.uuid4().hex})
            assert spec.id is not None
            chunk.append(spec)
            if len(chunk) >= batch:
                self._send_chunk(chunk, ids, conflicts)
                chunk = []
        if chunk:
            self._send_chunk(chunk, ids, conflicts)
        if conflicts:
            raise IdConflictError(conflicts, ids)
        return ids

    def _send_chunk(self, specs: list[JobSpec], ids: list[str], conflicts: list[str]) -> None:
        """Send the chunk's new jobs; append the accepted ids to ``ids``, the ids taken by
        another spec to ``conflicts``."""
        now = datetime.now(UTC)
        fresh: dict[str, tuple[JobSpec, dict[str, Any], str]] = {}
        order: list[tuple[str, str]] = []
        for spec in specs:
            assert spec.id is not None
            compact = compact_spec(spec)
            digest = spec_hash(compact)
            order.append((spec.id, digest))
            if spec.id not in fresh:
                fresh[spec.id] = (spec, compact, digest)
        pipe = self.redis.pipeline(transaction=False)
        for job_id, (_, _, digest) in fresh.items():
            state = JobState(at=now, notify=self.done_key, spec=digest).dump()
            pipe.set(self.keys.job(job_id), state, nx=True, ex=self.settings.result_ttl_s)
        taken = dict(zip(fresh, pipe.execute(), strict=True))
        known = self._known_hashes([job_id for job_id, ok in taken.items() if not ok])
        to_send = [fresh[job_id] for job_id, ok in taken.items() if ok]
        for job_id, digest in order:
            if taken[job_id] or known.get(job_id) in (digest, ""):  # "": before hashes
                ids.append(job_id)
            else:
                conflicts.append(job_id)
        if not to_send:
            return
        try:
            self._publish(to_send, now)
        except BaseException:
            # Unsent jobs must not look submitted, or resubmitting them would be a no-op.
            self.redis.delete(*(self.keys.job(spec.id or "") for spec, _, _ in to_send))
            raise

    def _known_hashes(self, job_ids: list[str]) -> dict[str, str]:
        """The spec hashes recorded for ids already taken (left out where the state is gone)."""
        if not job_ids:
            return {}
        states = self.redis.mget([self.keys.job(job_id) for job_id in job_ids])
        found: dict[str, str] = {}
        for job_id, raw in zip(job_ids, states, strict=True):
            state = loads(raw)
            if state is not None:
                found[job_id] = str(state.get("spec", ""))
        return found

    def _publish(
        self, specs: list[tuple[JobSpec, dict[str, Any], str]], queued_at: datetime
    ) -> None:
        app = self.celery
        queue = self.settings.queue
        with app.producer_or_acquire() as producer:
            # Declare the queue once here, not once per message (a third of the cost).
            producer.maybe_declare(app.amqp.queues[queue])
            self._publish_batch(app, producer, queue, specs, queued_at)

    def _publish_batch(
        self,
        app: Celery,
        producer: Any,
        queue: str,
        specs: list[tuple[JobSpec, dict[str, Any], str]],
        queued_at: datetime,
    ) -> None:
        # kombu's publish batch sends the whole chunk in one pipelined round trip; a
        # failure raises, and the caller forgets the chunk so it can be resubmitted.
        with producer.batch(max_size=len(specs)):
            for spec, compact, _ in specs:
                assert spec.id is not None
                meta = MessageMeta(id=spec.id, queued_at=queued_at, notify=self.done_key)
                app.send_task(
                    TASK_NAME,
                    args=[compact, meta.model_dump(mode="json", exclude_none=True)],
                    task_id=spec.id,
                    queue=queue,
                    producer=producer,
                    declare=[],
                    retry=False,
                    # Flower and logs see this summary, never the code.
                    argsrepr=spec.summary(),
                    kwargsrepr="{}",
                    soft_time_limit=spec.limits.timeout_s + margins.SOFT_LIMIT_MARGIN_S,
                    time_limit=spec.limits.timeout_s + margins.HARD_LIMIT_MARGIN_S,
                )

    # --- results ----------------------------------------------------------------------

    def results(self, ids: Iterable[str], batch: int = DEFAULT_BATCH) -> dict[str, JobResult]:
        """The stored results among ``ids`` (one MGET per ``batch`` ids)."""
        found: dict[str, JobResult] = {}
        ids = list(ids)
        for start in range(0, len(ids), batch):
            part = ids[start : start + batch]
            values = self.redis.mget([self.keys.result(i) for i in part])
            for job_id, raw in zip(part, values, strict=True):
                if raw is not None:
                    found[job_id] = JobResult.model_validate_json(raw)
        return found

    def result(self, job_id: str, timeout: float | None = None) -> JobResult | None:
        """The job's result; None if not final. ``timeout``: seconds to wait (None: no wait)."""
        deadline = time.monotonic() + (timeout or 0)
        delay = 0.02
        while True:
            raw = self.redis.get(self.keys.result(job_id))
            if raw is not None:
                return JobResult.model_validate_json(raw)
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            time.sleep(min(delay, left))
            delay = min(delay * 2, 0.5)

    def state(self, job_id: str) -> str:
        """Where a job is: its final status, "running", "queued", or "unknown" (never
        submitted here, or its result expired)."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.get(self.keys.result(job_id))
        pipe.exists(self.keys.running(job_id))
        pipe.exists(self.keys.job(job_id))
        result, running, known = pipe.execute()
        if result is not None:
            return str(JobResult.model_validate_json(result).status.value)
        return "running" if running else "queued" if known else "unknown"

    def as_completed(
        self,
        ids: Iterable[str],
        timeout: float | None = None,
        batch: int = DEFAULT_BATCH,
        rescan_s: float = 2.0,
        notice: Callable[[str], None] | None = None,
    ) -> Iterator[JobResult]:
        """Yield each job's result once, as it finishes (those already done first).

        Raises TimeoutError if ``timeout`` seconds pass with jobs unfinished (naming the
        queue and its workers). ``notice`` hears, after a few idle seconds, that no
        online worker consumes the queue (the wait goes on).
        """
        pending = set(ids)
        watch = WaitWatch(self, notice)
        deadline = None if timeout is None else time.monotonic() + timeout
        for result in self.results(list(pending), batch).values():
            pending.discard(result.id or "")
            yield result
        last_rescan = time.monotonic()
        while pending:
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                raise TimeoutError(
                    f"{len(pending)} jobs not finished after {timeout:g}s on {watch.describe()}"
                )
            watch.tick()
            block = 1.0 if deadline is None else max(0.01, min(1.0, deadline - now))
            popped = self.redis.blmpop(block, 1, self.done_key, direction="LEFT", count=batch)
            found: list[JobResult] = []
            if popped:
                done = [i.decode() if isinstance(i, bytes) else i for i in popped[1]]
                wanted = [i for i in dict.fromkeys(done) if i in pending]
                found = list(self.results(wanted, batch).values())
            elif time.monotonic() - last_rescan >= rescan_s:
                # Jobs announced to another client, or an announcement already popped.
                found = list(self.results(list(pending), batch).values())
                last_rescan = time.monotonic()
            for result in found:
                pending.discard(result.id or "")
                watch.progress()
                yield result

    def consumers(self) -> list[str]:
        """Online workers (fresh heartbeats) that consume this client's queue."""
        return [w["name"] for w in self.status()["workers"] if self.settings.queue in w["queues"]]

    def where(self) -> str:
        return f"queue {self.settings.queue} at {redact(self.settings.redis_url)}"

    # --- control ----------------------------------------------------------------------

    def cancel(self, job_id: str) -> bool:
        """Cancel a job: a queued one ends `cancelled` now, without running; a running
        one's sandbox is stopped. False if the job is unknown or already final."""
        keys = self.keys
        ttl = self.settings.result_ttl_s
        pipe = self.redis.pipeline(transaction=True)
        pipe.exists(keys.result(job_id))
        pipe.get(keys.job(job_id))
        final, state = pipe.execute()
        if final or state is None:
            return False
        # The cancel flag first, then look for a running sandbox: the worker sets its
        # running flag first, then looks for the cancel flag, so one of us sees the other.
        pipe = self.redis.pipeline(transaction=True)
        pipe.set(keys.cancel(job_id), "1", ex=ttl)
        pipe.exists(keys.running(job_id))
        _, running = pipe.execute()
        if not running:
            notify = (loads(state) or {}).get("notify")
            result = JobResult(id=job_id, status=Status.CANCELLED, message="cancelled while queued")
            result.timings.finished_at = datetime.now(UTC)
            self._scripts.store_result(result, notify, count_duplicate=False)
        return True

    def status(self) -> dict[str, Any]:
        """Queue depth, workers online (by their reapers' heartbeats), jobs in flight."""
        keys = self.keys
        now = time.time()
        pipe = self.redis.pipeline(transaction=False)
        pipe.llen(self.settings.queue)
        pipe.hlen(KOMBU_UNACKED)
        pipe.zremrangebyscore(keys.in_flight, "-inf", now)
        pipe.zcard(keys.in_flight)
        pipe.hgetall(keys.workers)
        pipe.get(keys.duplicates)
        queued, unacked, _, in_flight, beats, duplicates = pipe.execute()
        workers = []
        for name, raw in sorted(beats.items()):
            beat = Heartbeat.model_validate_json(raw)
            age = now - beat.ts
            if age <= margins.heartbeat_stale_after(beat.interval_s):
                info = beat.model_dump(mode="json")
                workers.append({"name": name.decode(), **info, "age_s": round(age, 1)})
        return {
            "queue": self.settings.queue,
            "queued": queued,
            "delivered_unacked": unacked,
            "in_flight": in_flight,
            "workers_online": len(workers),
            "workers": workers,
            "duplicates": int(duplicates or 0),
        }

    def close(self) -> None:
        self.redis.close()
        if self._app is not None:
            self._app.close()

    def __enter__(self) -> FarmClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

"""FarmClient: the trusted SDK. It submits through the same per-tenant queues and fair
share as the tenants' gateway, as its own tenant (``SANDFARM_CLIENT_TENANT``), and talks
to Redis directly (operators and batch users on the farm's side of the gateway).

- ``submit`` / ``submit_many``: one Lua call per chunk admits the jobs (an id taken by
  the same spec is the same job; by another, IdConflictError) and dispatches what the
  farm has room for; the rest wait their turn in the tenant's queue.
- ``as_completed``: each job's worker pushes its id on this client's completion list
  when it stores the result; the client pops up to ``batch`` ids per call (BLMPOP) and
  fetches their results with one MGET, so N jobs cost O(N / batch) calls. Ids submitted
  elsewhere (another client, a resumed batch) are found by an MGET rescan when the list
  is idle.
- Results, job state, attempt counters and completion lists all carry a TTL.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from producer.farm_status import farm_status
from producer.jobs import DEFAULT_BATCH, TenantJobs
from producer.protocol import (
    IdConflictError,
    JobsLostError,
    QuotaError,
    Settings,
    connect,
    get_settings,
)
from producer.protocol.connection import redact
from producer.protocol.errors import send_each
from producer.protocol.ids import client_id as checked_client_id
from producer.protocol.ids import random_hex_id
from producer.protocol.submission import compact_spec
from producer.protocol.tenants import Policy
from producer.waiting import WaitWatch
from sandbox_core import JobResult, JobSpec, parse_spec

if TYPE_CHECKING:  # Celery is imported where it is used: ~120 ms of every CLI start
    from celery import Celery

__all__ = ["DEFAULT_BATCH", "FarmClient", "compact_spec"]
# The trusted tenant is made (when missing) for batch use: a deep queue. Each waiting
# job holds about 1-2 KB of Redis memory, so a full queue fits its bytes bound with room
# for jobs with files; its results a day: a million of 16 KB. An operator may lower any
# of these (tenant set).
TRUSTED_MAX_QUEUED = 1_000_000
TRUSTED_POLICY = Policy(max_queued=TRUSTED_MAX_QUEUED, max_queued_mb=4096, result_mb_per_day=16384)
LOST_CHECK_S = 10.0  # while a wait is idle, look this often for jobs the farm forgot


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
        self.client_id = checked_client_id(client_id)
        self.done_key = self.keys.done(self.client_id)
        self.redis = connect(self.settings.redis_url)
        self.tenant = self.settings.client_tenant
        self.jobs = TenantJobs(self.redis, self.settings, self.tenant)
        self._app: Celery | None = None

    @property
    def celery(self) -> Celery:
        """A Celery app on the farm's broker (messages go out through submit_jobs.lua)."""
        if self._app is None:
            from producer.celery_app import make_app

            self._app = make_app(self.settings)
        return self._app

    # --- submission -------------------------------------------------------------------

    def submit(self, spec: JobSpec | dict[str, Any]) -> str:
        """Enqueue one job; returns its id. The same id and spec again is the same job."""
        return self.submit_many([spec])[0]

    def submit_many(
        self, specs: Iterable[JobSpec | dict[str, Any]], batch: int = DEFAULT_BATCH
    ) -> list[str]:
        """Enqueue many jobs; returns their ids in order.

        A dict is validated first (SpecError names the field), every job against this
        client's tenant policy (SpecError or PolicyError). An id already submitted (within
        the result TTL) with the same spec, or repeated in ``specs``, is returned but not
        sent again; an id taken by a different spec raises IdConflictError once the rest
        are sent (its ``submitted`` lists their ids). Over the tenant's rate or queue it
        waits and sends again (a chunk a smaller call would pass, in parts); over its CPU
        or result budget, or for a job alone over a bound: QuotaError (its ``submitted``
        lists the ids admitted before).
        """
        # made with the farm's result TTL (SANDFARM_RESULT_TTL_S): the default policy's
        # week kept SDK jobs' results whatever the setting said (a review)
        wanted = {**TRUSTED_POLICY.model_dump(), "result_ttl_s": self.settings.result_ttl_s}
        policy = self.jobs.tenants.ensure(self.tenant, Policy.model_validate(wanted))
        ids: list[str] = []
        conflicts: list[str] = []
        chunk: dict[str, JobSpec] = {}
        order: list[str] = []

        def flush() -> None:
            admitted: list[str] = []
            try:
                conflicts.extend(self._submit_patiently(list(chunk.values()), policy, admitted))
            except QuotaError as exc:
                exc.submitted = [*ids, *admitted]
                raise
            ids.extend(i for i in order if i not in conflicts)
            chunk.clear()
            order.clear()

        for item in specs:
            spec = item if isinstance(item, JobSpec) else parse_spec(item)
            if spec.id is None:
                spec = spec.model_copy(update={"id": random_hex_id()})
            assert spec.id is not None
            chunk.setdefault(spec.id, spec)  # a repeated id: the first spec speaks for it
            order.append(spec.id)
            if len(chunk) >= batch:
                flush()
        if order:
            flush()
        if conflicts:
            raise IdConflictError(conflicts, ids)
        return ids

    def _submit_patiently(
        self, specs: list[JobSpec], policy: Policy, admitted: list[str]
    ) -> list[str]:
        """Submit ``specs`` (their ids go to ``admitted`` as they are); returns the ids
        refused as conflicts. Over the tenant's rate or queue it waits as long as the
        farm says and sends again; a call a smaller one would pass goes in parts (over the
        bucket's burst: in bursts), as GatewayClient does; a spent budget raises."""
        while True:
            try:
                self.jobs.submit(specs, self.done_key, all_or_nothing=False, policy=policy)
                admitted.extend(spec.id or "" for spec in specs)
                return []
            except IdConflictError as exc:
                admitted.extend(spec.id or "" for spec in specs if spec.id not in exc.conflicts)
                return exc.conflicts
            except QuotaError as exc:
                burst = int(policy.bucket[1]) if policy.bucket else len(specs)
                if exc.fewer and exc.reason != "rate":
                    burst = (len(specs) + 1) // 2
                if (exc.reason == "rate" or exc.fewer) and len(specs) > max(burst, 1):
                    parts = [specs[start : start + burst] for start in range(0, len(specs), burst)]
                    return self._submit_in_parts(parts, policy, admitted)
                if exc.reason == "budget" or exc.fewer:
                    raise
                time.sleep(exc.retry_after_s)

    def _submit_in_parts(
        self, parts: list[list[JobSpec]], policy: Policy, admitted: list[str]
    ) -> list[str]:
        conflicts: list[str] = []

        def send(part: list[JobSpec]) -> None:
            conflicts.extend(self._submit_patiently(part, policy, admitted))

        send_each(parts, send)
        return conflicts

    # --- results ----------------------------------------------------------------------

    def results(self, ids: Iterable[str], batch: int = DEFAULT_BATCH) -> dict[str, JobResult]:
        """The stored results among ``ids`` (one MGET per ``batch`` ids)."""
        return self.jobs.results(ids, batch)

    def result(self, job_id: str, timeout: float | None = None) -> JobResult | None:
        """The job's result; None if not final. ``timeout``: seconds to wait (None: no wait)."""
        return self.jobs.result(job_id, timeout)

    def state(self, job_id: str) -> str:
        """Its final status, "running", "queued", or "unknown"."""
        return self.jobs.state(job_id)

    def known_hashes(self, ids: Sequence[str]) -> dict[str, str]:
        """The spec hash the farm holds for each of ``ids`` (where it still knows it)."""
        return self.jobs.known_hashes(ids)

    def as_completed(
        self,
        ids: Iterable[str],
        timeout: float | None = None,
        batch: int = DEFAULT_BATCH,
        rescan_s: float = 2.0,
        *,
        notice: Callable[[str], None] | None = None,
    ) -> Iterator[JobResult]:
        """Yield each job's result once, as it finishes (those already done first).

        Raises TimeoutError if ``timeout`` seconds pass with jobs unfinished (naming the
        queue and its workers), JobsLostError if the farm holds no record of some of them
        (they would never finish). ``notice`` hears, after a few idle seconds, that no
        online worker consumes the queue (the wait goes on).
        """
        pending = set(ids)
        watch = WaitWatch(self, notice)
        deadline = None if timeout is None else time.monotonic() + timeout
        # results are taken a chunk at a time (jobs.each_result): never all at once
        for _, result in self.jobs.each_result(list(pending), batch):
            pending.discard(result.id or "")
            yield result
        last_rescan = last_check = time.monotonic()
        while pending:
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                raise TimeoutError(
                    f"{len(pending)} jobs not finished after {timeout:g}s on {watch.describe()}"
                )
            watch.tick()
            block = 1.0 if deadline is None else max(0.01, min(1.0, deadline - now))
            wanted = self.jobs.done(self.done_key, pending, block, batch)
            found = 0
            if wanted:
                ids = wanted
            elif time.monotonic() - last_rescan >= rescan_s:
                # Jobs announced to another client, or an announcement already popped.
                ids, last_rescan = list(pending), time.monotonic()
            else:
                continue
            for _, result in self.jobs.each_result(ids, batch):
                pending.discard(result.id or "")
                watch.progress()
                found += 1
                yield result
            if not wanted and not found and last_rescan - last_check >= LOST_CHECK_S:
                self._check_known(pending)
                last_check = last_rescan

    def _check_known(self, pending: set[str]) -> None:
        """Raise JobsLostError for those of ``pending`` the farm has no record of (state
        and result are written in one step at admission: none of them means never)."""
        ordered = sorted(pending)
        known: set[str] = set()
        for start in range(0, len(ordered), DEFAULT_BATCH):
            known |= self.jobs.known(ordered[start : start + DEFAULT_BATCH])
        lost = [job_id for job_id in ordered if job_id not in known]
        if lost:
            raise JobsLostError(lost, self.where())

    def consumers(self) -> list[str]:
        """Online workers (fresh heartbeats) that consume this client's queue."""
        return [w["name"] for w in self.status()["workers"] if self.settings.queue in w["queues"]]

    def where(self) -> str:
        return f"queue {self.settings.queue} at {redact(self.settings.redis_url)}"

    # --- control ----------------------------------------------------------------------

    def cancel(self, job_id: str) -> bool:
        """Cancel a job: a waiting one ends `cancelled` now, without running; a running
        one's sandbox is stopped. False if the job is unknown or already final."""
        return self.jobs.cancel(job_id)

    def dispatch(self) -> int:
        """Move waiting jobs into the Celery queue while the farm has room (workers and
        gateways do this on their own; this is for tools)."""
        return self.jobs.scripts.dispatch()

    def status(self) -> dict[str, Any]:
        """Queue depth, workers online (by their reapers' heartbeats), jobs in flight,
        each tenant's waiting and running jobs."""
        return farm_status(self.redis, self.settings)

    def close(self) -> None:
        self.redis.close()
        if self._app is not None:
            self._app.close()

    def __enter__(self) -> FarmClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

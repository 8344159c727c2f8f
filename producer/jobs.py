"""One tenant's jobs: submit, read, wait for, cancel. The one implementation behind both
the trusted FarmClient (its own tenant) and the tenants' gateway (the caller's tenant):
every id here is the tenant's own; keys are by the qualified "tenant/id"."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

import redis

from producer.protocol import FarmScripts, Settings, result_fields, stats
from producer.protocol.scripts import loads
from producer.protocol.submission import prepare_all, submit
from producer.protocol.tenant_store import TenantStore, text
from producer.protocol.tenants import Policy, admit, qualified
from sandbox_core import JobResult, JobSpec, Status
from sandbox_core.errors import PolicyError, SpecError

DEFAULT_BATCH = 1000
LISTING_SCAN = 2000  # jobs one listing call looks at, at most (a few MB read from Redis)


# One MGET's reply at most (but a single result, which the result bound bounds).
FETCH_BYTES = 32 * 1024 * 1024
# what a caller that takes results one by one holds of them at once (each_result)
ITER_BYTES = 8 * 1024 * 1024


class TenantJobs:
    def __init__(self, client: redis.Redis, settings: Settings, tenant: str) -> None:
        self.redis = client
        self.settings = settings
        self.keys = settings.keys
        self.tenant = tenant
        self.scripts = FarmScripts(client, settings)
        self.tenants = TenantStore(client, self.keys)

    def qid(self, job_id: str) -> str:
        return qualified(self.tenant, job_id)

    def policy(self) -> Policy:
        return self.tenants.policy(self.tenant)

    # --- in -----------------------------------------------------------------------

    def submit(
        self,
        specs: Sequence[JobSpec],
        notify: str | None,
        *,
        all_or_nothing: bool,
        policy: Policy | None = None,
    ) -> list[str]:
        """Admit ``specs`` (each with an id, as the policy allows: see admit(), which raises
        otherwise) through the fair-share queue; see protocol.submission.submit."""
        policy = policy or self.policy()
        try:
            specs = [admit(spec, policy) for spec in specs]
        except (SpecError, PolicyError):
            stats.count_refused(self.redis, self.keys, self.tenant, "policy", len(specs))
            raise
        now = datetime.now(UTC)
        queue = self.settings.queue
        prefix = self.keys.prefix
        jobs = prepare_all(specs, self.tenant, policy, notify, queue, now, prefix)
        return submit(self.scripts, self.tenant, policy, jobs, all_or_nothing=all_or_nothing)

    # --- out ----------------------------------------------------------------------

    def results(self, ids: Iterable[str], batch: int = DEFAULT_BATCH) -> dict[str, JobResult]:
        """The stored results among ``ids``: their sizes first (one STRLEN each, ``batch``
        ids a round trip), then MGETs of at most FETCH_BYTES each (but one result)."""
        return dict(self.each_result(ids, batch, FETCH_BYTES))

    def each_result(
        self, ids: Iterable[str], batch: int = DEFAULT_BATCH, chunk_bytes: int = ITER_BYTES
    ) -> Iterator[tuple[str, JobResult]]:
        """(id, result) of the stored results among ``ids``, fetched ``chunk_bytes`` at a
        time as they are taken: the caller holds one chunk, not all of them (a review:
        a batch resumed over 200 results of 6 MB took the client 1.26 GB at once)."""
        ids = list(ids)
        for start in range(0, len(ids), batch):
            part = ids[start : start + batch]
            yield from self._fetched(list(zip(part, self._sizes(part), strict=True)), chunk_bytes)

    def _sizes(self, ids: Sequence[str]) -> list[int]:
        pipe = self.redis.pipeline(transaction=False)
        for job_id in ids:
            pipe.strlen(self.keys.result(self.qid(job_id)))
        return [int(size) for size in pipe.execute()]

    def _fetched(
        self, sized: Sequence[tuple[str, int]], chunk_bytes: int = FETCH_BYTES
    ) -> Iterator[tuple[str, JobResult]]:
        """The results of ``sized`` (id, stored size; 0: none), an MGET of at most
        ``chunk_bytes`` (FETCH_BYTES at most) at a time: Redis builds a reply whole in its
        own memory (a review: one MGET of 40 results of 16 MiB took it 620 MB past its
        maxmemory, every other client's write refused meanwhile)."""
        chunk: list[str] = []
        held = 0
        for job_id, size in [*sized, ("", -1)]:  # the sentinel sends the last chunk
            if chunk and (size < 0 or held + size > min(chunk_bytes, FETCH_BYTES)):
                values = self.redis.mget([self.keys.result(self.qid(i)) for i in chunk])
                for one, raw in zip(chunk, values, strict=True):
                    if raw is not None:
                        yield one, JobResult.model_validate_json(raw)
                chunk, held = [], 0
            if size > 0:
                chunk.append(job_id)
                held += size

    def results_within(
        self, ids: Sequence[str], max_bytes: int
    ) -> tuple[dict[str, JobResult], list[str]]:
        """The stored results among ``ids``, in order, while their stored JSON adds up to
        at most ``max_bytes`` (the first always comes, whatever its size); and the ids
        whose results are stored but left out. Sizes are asked first (STRLEN), so a reply
        never makes Redis, or us, hold more than the bound."""
        taken: list[tuple[str, int]] = []
        withheld: list[str] = []
        left = max_bytes
        for job_id, size in zip(ids, self._sizes(ids), strict=True):
            if not size:
                continue  # not final (or expired)
            if taken and (withheld or size > left):
                withheld.append(job_id)
                continue
            taken.append((job_id, size))
            left -= size
        return dict(self._fetched(taken)), withheld

    def result(self, job_id: str, timeout: float | None = None) -> JobResult | None:
        """The job's result; None if not final. ``timeout``: seconds to wait (None: no wait)."""
        deadline = time.monotonic() + (timeout or 0)
        delay = 0.02
        while True:
            raw = self.redis.get(self.keys.result(self.qid(job_id)))
            if raw is not None:
                return JobResult.model_validate_json(raw)
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            time.sleep(min(delay, left))
            delay = min(delay * 2, 0.5)

    def state(self, job_id: str) -> str:
        """Where a job is: its final status, "running", "queued", or "unknown" (never
        submitted by this tenant, or its result expired)."""
        done = result_fields.summaries(self.redis, [self.keys.result(self.qid(job_id))])[0]
        return done[0] if done is not None else self._where([job_id])[job_id]

    def _where(self, ids: Sequence[str]) -> dict[str, str]:
        """ "running", "queued" or "unknown" for each of ``ids`` (jobs with no result), in
        one round trip."""
        pipe = self.redis.pipeline(transaction=False)
        for job_id in ids:
            pipe.exists(self.keys.running(self.qid(job_id)))
            pipe.exists(self.keys.job(self.qid(job_id)))
        flags = pipe.execute()
        return {
            job_id: "running" if running else "queued" if known else "unknown"
            for job_id, running, known in zip(ids, flags[::2], flags[1::2], strict=True)
        }

    def known(self, ids: Sequence[str]) -> set[str]:
        """Those of ``ids`` the farm holds a record of for this tenant (one round trip)."""
        pipe = self.redis.pipeline(transaction=False)
        for job_id in ids:
            pipe.exists(self.keys.job(self.qid(job_id)), self.keys.result(self.qid(job_id)))
        return {job_id for job_id, n in zip(ids, pipe.execute(), strict=True) if n}

    def done(self, done_key: str, wanted: set[str] | None, block_s: float, batch: int) -> list[str]:
        """Ids (among ``wanted``, unless None) announced on the completion list
        ``done_key``, waiting up to ``block_s`` for the first announcement (one BLMPOP;
        no wait at all for ``block_s`` <= 0)."""
        if block_s <= 0:
            popped: Any = self.redis.lmpop(1, done_key, direction="LEFT", count=batch)
        else:
            popped = self.redis.blmpop(block_s, 1, done_key, direction="LEFT", count=batch)
        if not popped:
            return []
        prefix = f"{self.tenant}/"
        ids = (text(item).removeprefix(prefix) for item in popped[1])
        return [i for i in dict.fromkeys(ids) if wanted is None or i in wanted]

    def give_back(self, done_key: str, ids: Sequence[str]) -> None:
        """Put announcements taken from the completion list ``done_key`` back at its
        head, in their order: the next ask hands them out."""
        if ids:
            self.redis.lpush(done_key, *reversed(ids))

    def known_hashes(self, ids: Sequence[str]) -> dict[str, str]:
        """The spec hash recorded for each id this tenant submitted (left out where the
        farm no longer knows it): how resume tells an edited line from a done one."""
        if not ids:
            return {}
        states = self.redis.mget([self.keys.job(self.qid(i)) for i in ids])
        found: dict[str, str] = {}
        for job_id, raw in zip(ids, states, strict=True):
            state = loads(raw)
            if state is not None:
                found[job_id] = str(state.get("spec", ""))
        return found

    # --- control ------------------------------------------------------------------

    def cancel(self, job_id: str) -> bool:
        """Cancel a job: a waiting one ends `cancelled` now, without running; a running
        one's sandbox is stopped. False if the job is unknown or already final."""
        keys, qid = self.keys, self.qid(job_id)
        ttl = self.policy().result_ttl_s  # as its record's, and the result a worker stores
        pipe = self.redis.pipeline(transaction=True)
        pipe.exists(keys.result(qid))
        pipe.get(keys.job(qid))
        final, state = pipe.execute()
        if final or state is None:
            return False
        # The cancel flag first, then look for a running sandbox: the worker sets its
        # running flag first, then looks for the cancel flag, so one of us sees the other.
        pipe = self.redis.pipeline(transaction=True)
        pipe.set(keys.cancel(qid), "1", ex=ttl)
        pipe.exists(keys.running(qid))
        _, running = pipe.execute()
        if not running:
            notify = (loads(state) or {}).get("notify")
            result = JobResult(id=job_id, status=Status.CANCELLED, message="cancelled while queued")
            result.timings.finished_at = datetime.now(UTC)
            # stored only if no other result came first: a job that ended meanwhile was
            # not cancelled (a review saw True for jobs that then read succeeded)
            return bool(
                self.scripts.store_result(
                    result, notify, qid, self.tenant, ttl=ttl, count_duplicate=False
                )
            )
        return True

    def listing(
        self,
        after: tuple[float, str] | None,
        limit: int,
        status: str | None,
        label: tuple[str, str] | None,
    ) -> tuple[list[dict[str, object]], tuple[float, str] | None]:
        """This tenant's jobs, newest first, after the cursor ``after`` (the submit time
        and id of the last one seen: jobs of one batch share a time), filtered by status
        and (finished jobs') label; returns (jobs, the next cursor, or None at the end).
        One call looks at most LISTING_SCAN jobs: a filter that matches few of them
        returns a short page (even an empty one) with a cursor to look further."""
        top: str = repr(after[0]) if after is not None else "+inf"
        found: list[dict[str, object]] = []
        skip = scanned = 0
        while True:
            if scanned >= LISTING_SCAN:
                return found, after
            raw: Any = self.redis.zrevrangebyscore(
                self.keys.joblist(self.tenant), top, "-inf", start=skip, num=200, withscores=True
            )
            if not raw:
                return found, None
            # Ties come in reverse id order: those at the cursor's time not past it are seen.
            page = [
                (text(qid).partition("/")[2], float(score))
                for qid, score in raw
                if after is None or float(score) < after[0] or text(qid) < self.qid(after[1])
            ]
            if not page:  # a full page of ties already seen: look further
                skip += len(raw)
                continue
            skip = 0
            scanned += len(page)
            done = result_fields.summaries(
                self.redis, [self.keys.result(self.qid(job_id)) for job_id, _ in page]
            )
            where = self._where(
                [job_id for (job_id, _), d in zip(page, done, strict=True) if d is None]
            )
            for (job_id, score), summary in zip(page, done, strict=True):
                job_status, labels = summary or (where[job_id], {})
                after = (score, job_id)
                if (status and job_status != status) or (
                    label and labels.get(label[0]) != label[1]
                ):
                    continue
                found.append({"id": job_id, "status": job_status, "labels": labels})
                if len(found) >= limit:
                    return found, after
            top = repr(after[0]) if after is not None else "+inf"

"""A slot's chain: the jobs one delivered message runs back to back.

Celery hands a pool process one message per job: the main process BRPOPs it, records it
unacked, sends three task events, pickles it over a pipe, and acks it after; at 2 slots
that cost as much CPU as a small job itself (ops/bench/RESULTS.md). So a slot that
finishes a job stores its result and takes the next dispatched job in the same Redis
round trip (finish_job.lua): the message a worker's BRPOP would have taken next, in
the order fair share put it in the Celery queue. It keeps doing so for ``chain_s``
seconds, then returns to Celery for its next message.

Nothing is lost or run twice on the way: the first message stays unacked while its chain
runs, and the chain's record (``Keys.chain``) names the job the slot runs now. A slot
that dies leaves the message to be redelivered (at once for a killed pool process,
after the visibility timeout for a dead worker); its new delivery finds the record and
runs that job again, with its attempt counted (begin_attempt.lua). A job is taken only
if its deadline falls before the message's soft time limit and visibility timeout, with
``margins.CHAIN_SLACK_S`` to spare (less the time the step took to reach Redis: redis-py
resends it after a lost connection), so the message is never redelivered while its
chain is alive. A warm shutdown stops chains at their current job.
"""

from __future__ import annotations

import base64
import logging
import math
import os
import re
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

import redis
from pydantic_core import from_json

from producer.protocol import LateStepError, MessageMeta, RunningRecord, margins
from producer.protocol.scripts import ChainStep, Claimed
from sandbox_core import JobResult
from worker import events
from worker.app import settings, slot_index, stopping
from worker.instance import INSTANCE, process_identity
from worker.jobs import Job, client, scripts, spec_digest_of, timeout_of
from worker.kombu_fixes import DELIVERED_PROPERTY

log = logging.getLogger(__name__)
T = TypeVar("T")


def chain_s() -> float:
    """How long a chain takes jobs: none where a worker prefetches messages beyond its
    slots (one could wait in the main process behind a whole chain, its visibility
    timeout running, which a chain's clock, started with its task, would not count)."""
    return settings.chain_s if settings.prefetch_multiplier == 1 else 0.0


_TAG = re.compile(r"[0-9A-Za-z-]{1,64}")  # kombu's delivery tags are uuids


def _delivery(request: Any) -> tuple[str | None, float | None]:
    """kombu's tag of the delivered message (a uuid) and the score its delivery has in
    kombu's index (worker/kombu_fixes.py), if they look like them."""
    properties = getattr(request, "properties", None) or {}
    tag, score = properties.get("delivery_tag"), properties.get(DELIVERED_PROPERTY)
    if not isinstance(tag, str) or not _TAG.fullmatch(tag):
        return None, None
    return tag, score if isinstance(score, float) and math.isfinite(score) else None


class Chain:
    """The jobs of one delivered message (whose qid is ``root``), in this pool process."""

    def __init__(self, request: Any, root: str) -> None:
        self.root = root
        self.token = uuid.uuid4().hex  # this delivery's: a redelivery takes the chain over
        self.clock = time.monotonic()  # about when the message was delivered
        self.hostname: str | None = request.hostname
        self.task_name: str = request.task
        hard_soft = request.timelimit or (None, None)
        soft = hard_soft[1] or margins.WORKER_SOFT_LIMIT_S
        self.limit_s = min(float(soft), settings.visibility_timeout) - margins.CHAIN_SLACK_S
        tag, delivered = _delivery(request)
        self.running = RunningRecord(
            worker=self.hostname,
            pid=os.getpid(),
            slot=slot_index(),
            instance=INSTANCE,
            process=process_identity(os.getpid()),
            tag=tag,
            delivered=delivered,
        )
        self._channel: str | None = None

    def begin(self, spec: Any, raw_meta: MessageMeta) -> Job | None:
        """The delivered message's job; or the job its chain was running when the slot
        died; None: nothing to run (final already, or cancelled by then)."""
        claimed = scripts().begin_attempt(raw_meta.qid, self.running, timeout_of(spec), self.token)
        return None if claimed is None else _job(claimed, spec, raw_meta)

    def finish(self, job: Job, result: JobResult, text: str) -> tuple[bool, Job | None]:
        """Store ``result`` (False: a duplicate, not stored) and take the chain's next job
        if it has time left; ``text`` is the job's summary for its task events."""
        elapsed = time.monotonic() - self.clock
        room = self.limit_s - elapsed
        want = elapsed < chain_s() and room > 0 and not stopping()
        meta = job.meta
        digest = spec_digest_of(job.spec)
        step = ChainStep(
            self.root,
            self.token,
            want,
            room,
            self.running,
            self._events(job, result, text) if meta.qid != self.root else None,
        )
        stored, claimed = self._when_redis_has_room(
            lambda: scripts().finish_job(
                result, meta.notify, meta.qid, meta.tenant, meta.ttl, step, digest
            )
        )
        if claimed is None:
            return stored, None
        taken = _job(claimed, None, None)
        # finish_job checked the room as the step reached Redis; the answer itself may
        # come back late (a resend after a lost connection returns the job taken then)
        room, timeout = self.limit_s - (time.monotonic() - self.clock), timeout_of(taken.spec)
        if timeout > room:
            raise LateStepError(taken.meta.qid, timeout, room)
        return stored, taken

    def _when_redis_has_room(self, store: Callable[[], T]) -> T:
        """``store()``, again while a full Redis refuses it (maxmemory, noeviction) and
        the message is still this slot's (its visibility timeout): the refused script
        wrote nothing (its first write is the result's SET), so the job is neither lost
        nor run again. Past that, the error: the message is redelivered once there is
        room, and the job runs again."""
        pause = 0.1
        while True:
            try:
                return store()
            except redis.exceptions.OutOfMemoryError as exc:
                if self.limit_s - (time.monotonic() - self.clock) <= pause:
                    raise
                log.warning("Redis is full (%s): holding a result %.1f s for room", exc, pause)
                time.sleep(pause)
                pause = min(pause * 2, 5.0)

    def _events(self, job: Job, result: JobResult, text: str) -> tuple[str, str] | None:
        """The task events of a job Celery never saw (published once it is stored)."""
        if not settings.task_events:
            return None
        if self._channel is None:
            db = client().connection_pool.connection_kwargs.get("db") or 0
            self._channel = events.channel(int(db))
        finished = result.timings.finished_at or datetime.now(UTC)
        payload = events.task_events(
            hostname=self.hostname or "",
            qid=job.meta.qid,
            name=self.task_name,
            argsrepr=job.argsrepr,
            result=text,
            received=job.began.timestamp(),
            started=job.began.timestamp(),
            finished=finished.timestamp(),
        )
        return self._channel, payload


def _job(claimed: Claimed, spec: Any, meta: MessageMeta | None) -> Job:
    """The Job of what begin or finish took: the delivered message's own (spec, meta
    given), or a chain's, whose spec and meta are in its own task message."""
    argsrepr = ""
    if claimed.message:
        spec, meta, argsrepr = from_message(claimed.message, claimed.qid)
    assert meta is not None
    return Job(
        spec=spec,
        meta=meta,
        attempts=claimed.attempts,
        cancelled=claimed.cancelled,
        dispatched=claimed.dispatched,
        began=datetime.now(UTC),
        argsrepr=argsrepr,
    )


def from_message(raw: str, qid: str) -> tuple[Any, MessageMeta, str]:
    """(spec, meta, argsrepr) of a task message finish_job or begin_attempt handed over.
    Its spec is validated when the job runs; a meta that does not parse is rebuilt from
    the qid (so the job still gets its result: `rejected`, for a spec of None)."""
    spec: Any = None
    meta: MessageMeta | None = None
    argsrepr = ""
    try:
        message = from_json(raw)
        argsrepr = str(message["headers"].get("argsrepr") or "")
        body = message["body"]
        if message["properties"].get("body_encoding") == "base64":
            body = base64.b64decode(body)
        args = from_json(body)[0]
        spec, meta = args[0], MessageMeta.model_validate(args[1])
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        meta = None
    if meta is None or meta.qid != qid:
        tenant, _, job_id = qid.rpartition("/")
        meta, spec = MessageMeta(id=job_id, tenant=tenant or None), None
    return spec, meta, argsrepr.replace("backend=default", f"backend={settings.default_backend}", 1)

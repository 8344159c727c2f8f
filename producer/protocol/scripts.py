"""The farm's Lua scripts (``scripts/*.lua``, as dramatiq keeps them) behind typed calls.

Each script is one atomic step of the contract; its KEYS and ARGV are documented at the
top of its file and built only here. Scripts that dispatch start with the shared
``lib_dispatch.lua``.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import cache
from importlib import resources
from typing import Any

import redis

from producer.protocol import margins, stats
from producer.protocol.broker import TASK_NAME
from producer.protocol.records import RunningRecord
from producer.protocol.settings import Settings
from sandbox_core import JobResult

# The libraries each script starts with, in order (a library uses those before it).
_LIBRARIES = {
    "submit_jobs": ("lib_dispatch",),
    "dispatch": ("lib_dispatch",),
    "store_result": ("lib_dispatch", "lib_store"),
    "begin_attempt": ("lib_dispatch", "lib_begin"),
    "finish_job": ("lib_dispatch", "lib_store", "lib_begin"),
}


@cache
def source(name: str) -> str:
    """The text of ``scripts/<name>.lua``, after the libraries it uses (its ``#!lua``
    line, if any, first: Redis reads a script's flags there)."""
    files = resources.files("producer.protocol").joinpath("scripts")
    parts = [files.joinpath(f"{lib}.lua").read_text() for lib in _LIBRARIES.get(name, ())]
    own = files.joinpath(f"{name}.lua").read_text()
    if own.startswith("#!"):
        shebang, _, own = own.partition("\n")
        parts.insert(0, shebang)
    return "\n".join([*parts, own])


# lib_store.lua's answers that mean the result is stored: 1 now, 2 by this same call's
# earlier send (0: a duplicate, 3: not its record's job's)
STORED = (1, 2)


def _store_token() -> tuple[str, int]:
    """A store call's own token and its TTL: redis-py's retry sends the same call again,
    so a retry whose first answer was lost finds its own result (lib_store.lua), while
    another run's result, with another token, is a duplicate."""
    return os.urandom(8).hex(), margins.STORE_TOKEN_TTL_S


def utc_day(now: datetime | None = None) -> str:
    return (now or datetime.now(UTC)).strftime("%Y%m%d")


@dataclass(frozen=True)
class Admitted:
    """What submit_jobs said: per job "new", "same" or "conflict"; or why it refused all."""

    codes: list[str]
    refusal: str | None = None  # "conflict" | "queue_full" | "queue_bytes" | "rate" | "budget"
    detail: tuple[Any, ...] = ()


@dataclass(frozen=True)
class Claimed:
    """A job a worker took: ``message`` is its task message when it came by a chain
    (empty: the one delivered); ``dispatched``: when dispatch moved it (epoch s)."""

    qid: str
    message: str
    attempts: int
    cancelled: bool
    dispatched: float | None


@dataclass(frozen=True)
class ChainStep:
    """What a finishing job's slot asks of finish_job: its chain (the qid of the message it
    runs under) and this delivery's token; whether to take a next job, and the longest
    that may still start; the finished job's task events (channel, payload) if any; when
    the room was measured (epoch s, this host's clock), so a step that reaches Redis late
    (redis-py resends it after a lost connection) has that much less."""

    chain: str
    token: str
    want_next: bool
    room_s: float
    running: RunningRecord
    events: tuple[str, str] | None = None
    measured_at: float = field(default_factory=time.time)


@dataclass(frozen=True)
class Submission:
    """One job as submit_jobs takes it."""

    qid: str
    spec_hash: str
    state: str  # the JobState JSON
    message: str  # the Celery message, moved into the queue when dispatched


class FarmScripts:
    """The scripts registered on one Redis client (EVALSHA, loaded again if flushed)."""

    def __init__(self, client: redis.Redis, settings: Settings) -> None:
        self.settings = settings
        self.keys = settings.keys
        self._store: Any = client.register_script(source("store_result"))
        self._begin: Any = client.register_script(source("begin_attempt"))
        self._submit: Any = client.register_script(source("submit_jobs"))
        self._dispatch: Any = client.register_script(source("dispatch"))
        self._finish: Any = client.register_script(source("finish_job"))
        self._client = client

    def _dispatch_args(self) -> list[Any]:
        return [
            self.settings.queue,
            self.settings.dispatch_margin,
            self.settings.visibility_timeout,
        ]

    def submit_jobs(
        self,
        tenant: str,
        jobs: list[Submission],
        *,
        ttl: int,
        all_or_nothing: bool,
        max_queued: int,
        bucket: tuple[float, float] | None,
        cpu_budget_ms: float | None,
        max_queued_bytes: int | None = None,
        result_bytes_budget: int | None = None,
        day: str | None = None,
        client: redis.Redis | redis.client.Pipeline | None = None,
    ) -> Admitted:
        rate, burst = bucket if bucket else ("", "")
        day = day or utc_day()
        day_end = datetime.strptime(day, "%Y%m%d").replace(tzinfo=UTC) + timedelta(days=1)
        args: list[Any] = [
            self.keys.prefix,
            tenant,
            ttl,
            "all" if all_or_nothing else "some",
            max_queued,
            rate,
            burst,
            "" if cpu_budget_ms is None else cpu_budget_ms,
            day,
            self.settings.queue,
            self.settings.dispatch_margin,
            self.settings.visibility_timeout,
            len(jobs),
            stats.STATS_TTL_S,
        ]
        for job in jobs:
            args += [job.qid, job.spec_hash, job.state, job.message]
        args += [_or_none(max_queued_bytes), _or_none(result_bytes_budget), day_end.timestamp()]
        reply = [_text(v) for v in self._submit(keys=[], args=args, client=client)]
        if reply[0] == "ok":
            return Admitted(codes=reply[1].split())
        return Admitted(codes=[], refusal=reply[0], detail=tuple(reply[1:]))

    def dispatch(self, max_moves: int = 64) -> int:
        """Move waiting jobs into the Celery queue while the farm has room."""
        queue, margin, expiry = self._dispatch_args()
        return int(
            self._dispatch(keys=[], args=[self.keys.prefix, queue, margin, max_moves, expiry])
        )

    def _store_call(
        self,
        result: JobResult,
        notify: str | None,
        qid: str,
        tenant: str | None,
        ttl: int | None,
        count_duplicate: bool,
    ) -> tuple[list[str], list[Any]]:
        """KEYS and ARGV of lib_store.lua's store() for ``result``."""
        keys = self.keys
        payload = result.model_dump_json()
        queue, margin, expiry = self._dispatch_args()
        timings = result.timings
        run_s = (timings.run_ms or 0.0) / 1000
        # fair share charges the slot time the job held, not its wait for the slot (the
        # teardown of the job before it in this process, maybe another tenant's)
        slot_s = max(0.0, run_s - (timings.phases.slot_wait_ms or 0.0) / 1000)
        wait_s = (timings.queue_wait_ms or 0.0) / 1000
        store_keys = [
            keys.result(qid),
            notify or "",
            keys.duplicates if count_duplicate else keys.ignored,
            keys.in_flight,
            keys.running(qid),
            keys.stats,
            keys.stored_by(qid),
        ]
        args: list[Any] = [
            payload,
            ttl or self.settings.result_ttl_s,
            qid,
            self.settings.done_max_len,
            keys.prefix,
            tenant or "",
            utc_day(),
            result.status.value,
            result.resources.cpu_ms,
            timings.run_ms or 0.0,
            slot_s,
            queue,
            margin,
            expiry,
            timings.finished_at.timestamp() if timings.finished_at else "",
            result.backend or stats.NO_BACKEND,
            "" if timings.run_ms is None else stats.bucket_of(run_s),
            run_s,
            "" if timings.queue_wait_ms is None else stats.bucket_of(wait_s),
            wait_s,
            stats.STATS_TTL_S,
        ]
        return store_keys, args

    def store_result(
        self,
        result: JobResult,
        notify: str | None,
        qid: str,
        tenant: str | None,
        *,
        ttl: int | None = None,
        count_duplicate: bool = True,
        spec_digest: str = "",
    ) -> bool:
        """First stored result wins; returns False (counted as a duplicate) otherwise, but
        True when this same call stored it already (its answer lost, the client's retry
        sent it again). A stored result of a tenant's job counts its usage and dispatches
        the next job. ``spec_digest``: the spec hash of the job that ran (worker.jobs
        spec_digest_of): a result is stored only under a record of that hash
        (lib_store.lua orphaned), False otherwise; '' stores it unchecked."""
        store_keys, args = self._store_call(result, notify, qid, tenant, ttl, count_duplicate)
        reply = self._store(keys=store_keys, args=[*args, *_store_token(), spec_digest])
        return int(reply) in STORED

    def begin_attempt(
        self, qid: str, running: RunningRecord, timeout_s: float, token: str
    ) -> Claimed | None:
        """Take the delivered job ``qid`` (its wall timeout ``timeout_s``); or, when it is
        final and its chain ran on, the chain's job its slot was running (this delivery
        takes the chain over with ``token``). None: nothing to run."""
        reply = self._begin(
            keys=[],
            args=[
                self.keys.prefix,
                qid,
                running.dump(),
                timeout_s + margins.RUNNING_MARGIN_S,
                self.settings.result_ttl_s,
                stats.STATS_TTL_S,
                token,
                self._chain_ttl(),
                TASK_NAME,
                margins.HARD_LIMIT_MARGIN_S,
                margins.RUNNING_MARGIN_S,
            ],
        )
        attempts, cancelled, expiry, job, message = reply
        if int(attempts) < 0:
            return None
        return Claimed(
            _text(job), _text(message), int(attempts), bool(cancelled), self._dispatched(expiry)
        )

    def finish_job(
        self,
        result: JobResult,
        notify: str | None,
        qid: str,
        tenant: str | None,
        ttl: int | None,
        step: ChainStep,
        spec_digest: str = "",
    ) -> tuple[bool, Claimed | None]:
        """Store ``result`` (first one wins: (False, ...) for a duplicate, or for a job
        whose record names another spec, as store_result) and, if ``step`` asks for one, take the
        chain's next job in the same round trip."""
        store_keys, args = self._store_call(result, notify, qid, tenant, ttl, True)
        topic, events = step.events or ("", "")
        args += [
            step.chain,
            step.token,
            "1" if step.want_next else "",
            step.room_s,
            step.running.dump(),
            margins.RUNNING_MARGIN_S,
            margins.HARD_LIMIT_MARGIN_S,
            TASK_NAME,
            self.settings.result_ttl_s,
            self._chain_ttl(),
            topic,
            events,
            *_store_token(),
            step.measured_at,
            spec_digest,
        ]
        stored, job, message, attempts, cancelled, expiry = self._finish(keys=store_keys, args=args)
        if not job:
            return int(stored) in STORED, None
        claimed = Claimed(
            _text(job), _text(message), int(attempts), bool(cancelled), self._dispatched(expiry)
        )
        return int(stored) in STORED, claimed

    def chain_of(self, qid: str) -> tuple[str, str] | None:
        """(qid, message) of the job the chain under ``qid``'s message is running."""
        current, message = self._client.hmget(self.keys.chain(qid), ["q", "m"])
        if current is None or message is None:
            return None
        return _text(current), _text(message)

    def end_chain(self, qid: str) -> None:
        self._client.delete(self.keys.chain(qid))

    def _chain_ttl(self) -> int:
        # until a redelivery of the chain's message (a visibility timeout at most) has run
        # the chain's job again, whatever its length
        return int(2 * self.settings.visibility_timeout + margins.LONGEST_JOB_S)

    def _dispatched(self, expiry: object) -> float | None:
        # dispatch set the expiry to its time + the visibility timeout (see lib_dispatch)
        text = _text(expiry) if expiry is not None else ""
        return float(text) - self.settings.visibility_timeout if text else None


def _or_none(value: int | None) -> int | str:
    return "" if value is None else value


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def loads(raw: bytes | str | None) -> dict[str, Any] | None:
    """A stored JSON object, or None for a missing or unreadable value."""
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None

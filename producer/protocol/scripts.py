"""The farm's Lua scripts (``scripts/*.lua``, as dramatiq keeps them) behind typed calls.

Each script is one atomic step of the contract; its KEYS and ARGV are documented at the
top of its file and built only here. Scripts that dispatch start with the shared
``lib_dispatch.lua``.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from importlib import resources
from typing import Any

import redis

from producer.protocol import margins, stats
from producer.protocol.records import RunningRecord
from producer.protocol.settings import Settings
from sandbox_core import JobResult

_DISPATCHING = ("submit_jobs", "store_result", "dispatch")


@cache
def source(name: str) -> str:
    """The text of ``scripts/<name>.lua`` (after the dispatch library, where it uses it)."""
    files = resources.files("producer.protocol").joinpath("scripts")
    body = files.joinpath(f"{name}.lua").read_text()
    if name in _DISPATCHING:
        return files.joinpath("lib_dispatch.lua").read_text() + "\n" + body
    return body


def utc_day(now: datetime | None = None) -> str:
    return (now or datetime.now(UTC)).strftime("%Y%m%d")


@dataclass(frozen=True)
class Admitted:
    """What submit_jobs said: per job "new", "same" or "conflict"; or why it refused all."""

    codes: list[str]
    refusal: str | None = None  # "conflict" | "queue_full" | "rate" | "budget"
    detail: tuple[Any, ...] = ()


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
        client: redis.Redis | redis.client.Pipeline | None = None,
    ) -> Admitted:
        rate, burst = bucket if bucket else ("", "")
        args: list[Any] = [
            self.keys.prefix,
            tenant,
            ttl,
            "all" if all_or_nothing else "some",
            max_queued,
            rate,
            burst,
            "" if cpu_budget_ms is None else cpu_budget_ms,
            utc_day(),
            self.settings.queue,
            self.settings.dispatch_margin,
            self.settings.visibility_timeout,
            len(jobs),
            stats.STATS_TTL_S,
        ]
        for job in jobs:
            args += [job.qid, job.spec_hash, job.state, job.message]
        reply = [_text(v) for v in self._submit(keys=[], args=args, client=client)]
        if reply[0] == "ok":
            return Admitted(codes=reply[1:])
        return Admitted(codes=[], refusal=reply[0], detail=tuple(reply[1:]))

    def dispatch(self, max_moves: int = 64) -> int:
        """Move waiting jobs into the Celery queue while the farm has room."""
        queue, margin, expiry = self._dispatch_args()
        return int(
            self._dispatch(keys=[], args=[self.keys.prefix, queue, margin, max_moves, expiry])
        )

    def store_result(
        self,
        result: JobResult,
        notify: str | None,
        qid: str,
        tenant: str | None,
        *,
        ttl: int | None = None,
        count_duplicate: bool = True,
    ) -> bool:
        """First stored result wins; returns False (counted as a duplicate) otherwise. A
        stored result of a tenant's job counts its usage and dispatches the next job."""
        keys = self.keys
        payload = result.model_dump_json()
        queue, margin, expiry = self._dispatch_args()
        timings = result.timings
        run_s = (timings.run_ms or 0.0) / 1000
        wait_s = (timings.queue_wait_ms or 0.0) / 1000
        stored = self._store(
            keys=[
                keys.result(qid),
                notify or "",
                keys.duplicates if count_duplicate else keys.ignored,
                keys.in_flight,
                keys.running(qid),
                keys.stats,
            ],
            args=[
                payload,
                ttl or self.settings.result_ttl_s,
                qid,
                self.settings.done_max_len,
                keys.prefix,
                tenant or "",
                utc_day(),
                result.status.value,
                result.resources.cpu_ms,
                result.timings.run_ms or 0.0,
                len(payload),
                queue,
                margin,
                expiry,
                result.timings.finished_at.timestamp() if result.timings.finished_at else "",
                result.backend or stats.NO_BACKEND,
                "" if timings.run_ms is None else stats.bucket_of(run_s),
                run_s,
                "" if timings.queue_wait_ms is None else stats.bucket_of(wait_s),
                wait_s,
                stats.STATS_TTL_S,
            ],
        )
        return bool(stored)

    def begin_attempt(
        self, qid: str, tenant: str | None, running: RunningRecord, timeout_s: float
    ) -> tuple[int, bool, float | None]:
        """(attempt number, cancelled, when dispatch moved it (epoch s) if known);
        attempt -1 when the job already has a result."""
        keys = self.keys
        now = time.time()
        running_for = timeout_s + margins.RUNNING_MARGIN_S
        attempts, cancelled, dispatch_expiry = self._begin(
            keys=[
                keys.result(qid),
                keys.attempts(qid),
                keys.running(qid),
                keys.cancel(qid),
                keys.in_flight,
                keys.active(tenant) if tenant else "",
                keys.active_all if tenant else "",
                keys.stats,
                keys.message(qid),
            ],
            args=[
                self.settings.result_ttl_s,
                running.dump(),
                int(running_for),
                qid,
                now + running_for,
                now,
                stats.STATS_TTL_S,
            ],
        )
        expiry = _text(dispatch_expiry)
        # dispatch set the expiry to its time + the visibility timeout (see lib_dispatch)
        dispatched = float(expiry) - self.settings.visibility_timeout if expiry else None
        return int(attempts), bool(cancelled), dispatched


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

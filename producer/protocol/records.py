"""The typed records the farm keeps in Redis and sends with each message.

Unknown fields are ignored when reading (a newer peer may add some), never when writing.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from typing import Any

import redis
from pydantic import BaseModel, ConfigDict


class _Record(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    def dump(self) -> str:
        return self.model_dump_json(exclude_none=True)


class MessageMeta(_Record):
    """Sent with each task: ``args = [spec, meta]``."""

    id: str  # the job id as its tenant named it
    tenant: str | None = None  # whose job; its keys are by "tenant/id" (the task id)
    ttl: int | None = None  # seconds its result lives (the tenant's policy)
    queued_at: datetime | None = None
    notify: str | None = None  # the submitting client's completion list

    @property
    def qid(self) -> str:
        return f"{self.tenant}/{self.id}" if self.tenant else self.id


class JobState(_Record):
    """``Keys.job``: taken (SET NX) when a job is submitted, so an id runs once; ``spec``
    is the content hash of what the id names (the same id for another spec is refused)."""

    # Of its day's result budget (the UTC day of ``at``), what admission charged the job
    # (result_budget.py): first, so the scripts read both at a fixed place, before any
    # other field's text ('^{"kept":N,"at":"YYYY-MM-DD').
    kept: int | None = None
    at: datetime
    notify: str | None = None
    spec: str = ""
    # the slot time it may hold (its timeout): dispatch charges its tenant that much
    # virtual time, and the stored result's run time replaces the charge (lib_store)
    slot_s: float | None = None


class RunningRecord(_Record):
    """``Keys.running``: present while a sandbox runs the job (who runs it, where)."""

    worker: str | None
    pid: int
    slot: int
    at: float | None = None  # when it began, by Redis's clock (lib_begin.lua stamps it)
    instance: str | None = None  # of its worker (worker/instance.py)
    process: str | None = None  # its pool process: "boot pidns start" (sandbox_core.procid)
    tag: str | None = None  # the delivery tag of the message it runs under (kombu's)
    delivered: float | None = None  # that delivery's unacked_index score (kombu_fixes.py)


def redis_clock(client: redis.Redis) -> float:
    """Redis's own time (epoch seconds): what every heartbeat is stamped with and judged
    by, as the dispatch script judges them. A worker host's clock 18 s behind Redis's made
    it look gone and stopped dispatch (a review)."""
    seconds, micros = client.time()
    return float(seconds) + micros / 1e6


class Heartbeat(_Record):
    """``Keys.workers`` field: a worker's reaper writes it every reaper interval."""

    pid: int
    host: str
    slots: tuple[int, int]  # [first, last + 1)
    uids: tuple[int | None, int | None]
    concurrency: int
    queues: tuple[str, ...] = ()  # what it consumes
    backends: tuple[str, ...] = ()  # what it serves (the first: its default)
    interval_s: float = 5.0  # how often it beats: staleness is judged by its own pace
    ts: float = 0.0  # epoch seconds of the beat
    instance: str = ""  # this start of the worker (worker/instance.py)


def spec_hash(compact: dict[str, Any]) -> str:
    """The content hash of a job as submitted (its compact spec, the id left out)."""
    body = {k: v for k, v in compact.items() if k != "id"}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()[:32]

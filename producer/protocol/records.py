"""The typed records the farm keeps in Redis and sends with each message.

Unknown fields are ignored when reading (a newer peer may add some), never when writing.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict


class _Record(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    def dump(self) -> str:
        return self.model_dump_json(exclude_none=True)


class MessageMeta(_Record):
    """Sent with each task: ``args = [spec, meta]``."""

    id: str  # the job id (also the Celery task id)
    queued_at: datetime | None = None
    notify: str | None = None  # the submitting client's completion list


class JobState(_Record):
    """``Keys.job``: taken (SET NX) when a job is submitted, so an id runs once."""

    state: Literal["queued"] = "queued"
    at: datetime
    notify: str | None = None


class RunningRecord(_Record):
    """``Keys.running``: present while a sandbox runs the job (who runs it, where)."""

    worker: str | None
    pid: int
    slot: int


class Heartbeat(_Record):
    """``Keys.workers`` field: a worker's reaper writes it every reaper interval."""

    pid: int
    host: str
    slots: tuple[int, int]  # [first, last + 1)
    uids: tuple[int | None, int | None]
    concurrency: int
    ts: float = 0.0  # epoch seconds of the beat

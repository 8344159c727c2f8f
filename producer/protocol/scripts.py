"""The farm's Lua scripts (``scripts/*.lua``, as dramatiq keeps them) behind typed calls.

Each script is one atomic step of the contract; its KEYS and ARGV are documented at the
top of its file and built only here.
"""

from __future__ import annotations

import json
import time
from functools import cache
from importlib import resources
from typing import Any

import redis

from producer.protocol import margins
from producer.protocol.records import RunningRecord
from producer.protocol.settings import Settings
from sandbox_core import JobResult


@cache
def source(name: str) -> str:
    """The text of ``scripts/<name>.lua``."""
    return resources.files("producer.protocol").joinpath(f"scripts/{name}.lua").read_text()


class FarmScripts:
    """The scripts registered on one Redis client (EVALSHA, loaded again if flushed)."""

    def __init__(self, client: redis.Redis, settings: Settings) -> None:
        self.settings = settings
        self.keys = settings.keys
        self._store: Any = client.register_script(source("store_result"))
        self._begin: Any = client.register_script(source("begin_attempt"))

    def store_result(
        self, result: JobResult, notify: str | None, count_duplicate: bool = True
    ) -> bool:
        """First stored result wins; returns False (counted as a duplicate) otherwise."""
        keys = self.keys
        job_id = result.id or ""
        stored = self._store(
            keys=[
                keys.result(job_id),
                notify or "",
                keys.duplicates if count_duplicate else keys.ignored,
                keys.in_flight,
                keys.running(job_id),
            ],
            args=[
                result.model_dump_json(),
                self.settings.result_ttl_s,
                job_id,
                self.settings.done_max_len,
            ],
        )
        return bool(stored)

    def begin_attempt(
        self, job_id: str, running: RunningRecord, timeout_s: float
    ) -> tuple[int, bool]:
        """(attempt number, cancelled); attempt -1 when the job already has a result."""
        keys = self.keys
        now = time.time()
        running_for = timeout_s + margins.RUNNING_MARGIN_S
        attempts, cancelled = self._begin(
            keys=[
                keys.result(job_id),
                keys.attempts(job_id),
                keys.running(job_id),
                keys.cancel(job_id),
                keys.in_flight,
            ],
            args=[
                self.settings.result_ttl_s,
                running.dump(),
                int(running_for),
                job_id,
                now + running_for,
                now,
            ],
        )
        return int(attempts), bool(cancelled)


def loads(raw: bytes | str | None) -> dict[str, Any] | None:
    """A stored JSON object, or None for a missing or unreadable value."""
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None

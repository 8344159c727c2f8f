"""Waiting for results without waiting in silence: after a few seconds with no result
and no online worker consuming the queue, say so (and keep waiting); say it again now
and then; name the queue and its workers when a wait times out."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

NOTICE_AFTER_S = 5.0  # idle this long before looking for a consumer
NOTICE_EVERY_S = 30.0  # then look (and speak, if still none) this often


class Farm(Protocol):
    def consumers(self) -> list[str]: ...

    def where(self) -> str: ...


class WaitWatch:
    def __init__(self, farm: Farm, notice: Callable[[str], None] | None) -> None:
        self.farm = farm
        self.notice = notice
        self._idle_since = time.monotonic()
        self._next_look = self._idle_since + NOTICE_AFTER_S
        self._said_none = False

    def progress(self) -> None:
        self._idle_since = time.monotonic()
        self._next_look = self._idle_since + NOTICE_AFTER_S

    def tick(self) -> None:
        if self.notice is None or time.monotonic() < self._next_look:
            return
        self._next_look = time.monotonic() + NOTICE_EVERY_S
        workers = self.farm.consumers()
        if not workers:
            self.notice(f"no worker consumes {self.farm.where()}; still waiting")
            self._said_none = True
        elif self._said_none:
            self.notice(f"worker {', '.join(workers)} now consumes {self.farm.where()}")
            self._said_none = False

    def describe(self) -> str:
        """Where the jobs wait and who serves them, for a timeout's message."""
        workers = self.farm.consumers()
        served = f"workers: {', '.join(workers)}" if workers else "no worker consumes it"
        return f"{self.farm.where()} ({served})"

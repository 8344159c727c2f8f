"""Containers started ahead of jobs (the warm pool) and removed behind them (the remover),
both off the job's critical path."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from sandbox_core.backends.docker.containers import Profile
from sandbox_core.backends.docker.launcher import Launcher


@dataclass
class WarmContainer:
    """A started container and, where it came up, its first step's launcher."""

    id: str
    launcher: Launcher | None = None


class WarmPool:
    """Started containers for one profile, each used by exactly one job, refilled behind."""

    def __init__(
        self,
        profile: Profile,
        size: int,
        create: Callable[[Profile], WarmContainer],
        remove: Callable[[WarmContainer], None],
    ) -> None:
        self.profile = profile
        self.size = size
        self._create = create
        self._remove = remove
        self._ready: queue.Queue[WarmContainer] = queue.Queue()
        self._wanted = threading.Semaphore(0)
        self._closed = threading.Event()
        for _ in range(size):
            self._wanted.release()
        self._filler = threading.Thread(target=self._fill, daemon=True, name="sandfarm-pool")
        self._filler.start()

    def _fill(self) -> None:
        while not self._closed.is_set():
            if not self._wanted.acquire(timeout=0.5):
                continue
            try:
                container = self._create(self.profile)
            except Exception:  # engine hiccup: try again shortly, never crash the worker
                self._wanted.release()
                time.sleep(1)
                continue
            if self._closed.is_set():
                self._remove(container)
                return
            self._ready.put(container)

    def wait_ready(self, timeout_s: float = 60.0) -> bool:
        """Block until the pool holds ``size`` started containers (for benchmarks, tests)."""
        deadline = time.monotonic() + timeout_s
        while self._ready.qsize() < self.size:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    def take(self) -> WarmContainer | None:
        try:
            container = self._ready.get_nowait()
        except queue.Empty:
            return None
        self._wanted.release()  # refill in the background
        return container

    def close(self) -> None:
        self._closed.set()
        self._filler.join(timeout=60)
        while True:
            try:
                self._remove(self._ready.get_nowait())
            except queue.Empty:
                return


class Remover:
    """Removes containers on a background thread; ``close`` waits for every removal."""

    def __init__(self, remove: Callable[[str], None]) -> None:
        self._remove = remove
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def later(self, container_id: str) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, daemon=True)
                self._thread.start()
        self._queue.put(container_id)

    def _loop(self) -> None:
        while (container_id := self._queue.get()) is not None:
            self._remove(container_id)

    def close(self, timeout_s: float = 120.0) -> None:
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(None)
            thread.join(timeout=timeout_s)

"""The one interface of the farm's SDKs: FarmClient (trusted, Redis) and GatewayClient
(tenants, HTTP) both satisfy it, so the batch runner and the CLI take either."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Protocol, runtime_checkable

from sandbox_core import JobResult, JobSpec


@runtime_checkable
class JobClient(Protocol):
    def submit(self, spec: JobSpec | dict[str, Any]) -> str: ...

    def submit_many(
        self, specs: Iterable[JobSpec | dict[str, Any]], batch: int = ...
    ) -> list[str]: ...

    def result(self, job_id: str, timeout: float | None = None) -> JobResult | None: ...

    def results(self, ids: Iterable[str], batch: int = ...) -> dict[str, JobResult]: ...

    def state(self, job_id: str) -> str: ...

    def known_hashes(self, ids: Sequence[str]) -> dict[str, str]: ...

    def as_completed(
        self,
        ids: Iterable[str],
        timeout: float | None = None,
        *,
        notice: Callable[[str], None] | None = None,
    ) -> Iterator[JobResult]: ...

    def cancel(self, job_id: str) -> bool: ...

    def close(self) -> None: ...

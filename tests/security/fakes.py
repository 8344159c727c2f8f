"""Do-nothing backends: the suite's own control. A security test that passes against one of
these proves nothing (its attack never ran), so tests/meta runs the suite against each and
requires every test to fail.

``SANDFARM_TEST_FAKE_BACKEND=<kind>`` makes the security suite's ``backend`` fixture, and
every ``get_backend`` a security test calls, hand out the fake of that kind."""

from __future__ import annotations

import os
import threading
from contextlib import AbstractContextManager
from datetime import UTC, datetime

from sandbox_core.backends.base import Backend, Protection, Session
from sandbox_core.backends.config import ProcessConfig
from sandbox_core.models import (
    JobResult,
    JobSpec,
    Status,
    StepResult,
    StepStatus,
    Timings,
)

FAKE_ENV = "SANDFARM_TEST_FAKE_BACKEND"
FAKE_KINDS = ("rejected", "error", "empty", "failure")
PROTECTIONS = (
    "tree_kill",
    "uid_isolation",
    "network_isolation",
    "pid_namespace",
    "filesystem_isolation",
    "seccomp",
    "runtime",
)


def fake_kind() -> str | None:
    """The fake kind asked for in the environment, or None for the real backends."""
    kind = os.environ.get(FAKE_ENV, "").strip()
    if not kind:
        return None
    if kind not in FAKE_KINDS:
        raise ValueError(f"{FAKE_ENV}={kind!r}: choose one of {FAKE_KINDS}")
    return kind


class FakeBackend(Backend):
    """Runs nothing; answers every job with the same canned shape of result."""

    kind = "abstract"

    def __init__(self, name: str = "process", **_fields: object) -> None:
        super().__init__(ProcessConfig())
        self.name = f"fake-{self.kind}"
        self.imitates = name  # the backend the test asked for

    def protections(self) -> list[Protection]:
        return [Protection(name, True, f"fake {self.kind} backend") for name in PROTECTIONS]

    def open_session(self, spec: JobSpec) -> AbstractContextManager[Session]:
        raise AssertionError("a fake backend opens no session: it runs nothing")

    def close(self) -> None:
        pass

    def run(
        self,
        spec: JobSpec,
        *,
        cancel: threading.Event | None = None,
        queued_at: datetime | None = None,
    ) -> JobResult:
        now = datetime.now(UTC)
        status, message, steps = self.answer(spec)
        return JobResult(
            id=spec.id,
            status=status,
            message=message,
            steps=steps,
            backend=self.name,
            worker=self.worker,
            labels=spec.labels,
            timings=Timings(queued_at=queued_at, started_at=now, finished_at=now, run_ms=0.0),
        )

    def answer(self, spec: JobSpec) -> tuple[Status, str | None, list[StepResult]]:
        raise NotImplementedError


class RejectedBackend(FakeBackend):
    kind = "rejected"

    def answer(self, spec: JobSpec) -> tuple[Status, str | None, list[StepResult]]:
        return Status.REJECTED, "fake backend: rejected without running", []


class ErrorBackend(FakeBackend):
    kind = "error"

    def answer(self, spec: JobSpec) -> tuple[Status, str | None, list[StepResult]]:
        return Status.ERROR, "fake backend: the farm failed", []


class EmptyBackend(FakeBackend):
    """Every step 'succeeded' with exit 0 and nothing to show for it."""

    kind = "empty"

    def answer(self, spec: JobSpec) -> tuple[Status, str | None, list[StepResult]]:
        steps = [
            StepResult(kind=step.kind, status=StepStatus.SUCCEEDED, exit_code=0)
            for step in spec.steps  # a read_file step "read" an empty file
        ]
        return Status.SUCCEEDED, None, steps


class FailureBackend(FakeBackend):
    """Every step 'failed' with exit 1 and nothing to show for it."""

    kind = "failure"

    def answer(self, spec: JobSpec) -> tuple[Status, str | None, list[StepResult]]:
        steps = [
            StepResult(kind=step.kind, status=StepStatus.FAILED, exit_code=1) for step in spec.steps
        ]
        return Status.FAILED, None, steps


FAKES: dict[str, type[FakeBackend]] = {
    cls.kind: cls for cls in (RejectedBackend, ErrorBackend, EmptyBackend, FailureBackend)
}


def fake_get_backend(kind: str):
    """A stand-in for ``sandbox_core.get_backend`` that hands out the fake of ``kind``."""
    cls = FAKES[kind]

    def get_backend(backend: object = "process", **fields: object) -> Backend:
        name = backend if isinstance(backend, str) else getattr(backend, "type", "process")
        return cls(str(name), **fields)

    return get_backend

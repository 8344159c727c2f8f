"""The backend interface. The public logic (steps, statuses, workspace, timings) lives
here once; a backend only says how to open a session and run one process in it."""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime

from sandbox_core.backends.config import CommonConfig
from sandbox_core.backends.outcome import (
    CANCELLED_BETWEEN_STEPS,
    DEADLINE_PASSED,
    bounded,
    classify,
    counts,
    job_status,
    status_message,
)
from sandbox_core.errors import (
    CollectStoppedError,
    PolicyError,
    ProtectionUnavailableError,
    SandfarmError,
)
from sandbox_core.expected import mismatch
from sandbox_core.models import (
    BashStep,
    CollectedFile,
    ExecStep,
    JobResult,
    JobSpec,
    Limits,
    PythonStep,
    ReadFileStep,
    ResourceUsage,
    Status,
    StepResult,
    StepStatus,
    Timings,
    WriteFileStep,
)
from sandbox_core.output import HeadTailBuffer
from sandbox_core.runner import ExecOutcome


@dataclass(frozen=True)
class Protection:
    """One protection a backend may give, whether it is active here, and why (not)."""

    name: str
    active: bool
    detail: str


class Session(ABC):
    """One job's sandbox: a workspace plus a way to run processes in it."""

    slot_wait_ms: float | None = None  # set by backends whose sessions wait for a slot
    prewarmed: bool | None = None  # set by backends that can set a sandbox up ahead

    @property
    def alive(self) -> bool:
        """False once the sandbox itself was killed (a container after a timeout or flood)."""
        return True

    @abstractmethod
    def write_file(self, path: str, content: bytes) -> None: ...

    def write_files(self, files: dict[str, bytes]) -> None:
        for path, content in files.items():
            self.write_file(path, content)

    @abstractmethod
    def read_into(self, path: str, buffer: HeadTailBuffer) -> None: ...

    @abstractmethod
    def collect(self, patterns: list[str]) -> tuple[list[CollectedFile], int]: ...

    @abstractmethod
    def exec(
        self, step: ExecStep, index: int, deadline: float, cancel: threading.Event | None
    ) -> ExecOutcome:
        """Run one step to its outcome (``memory_exceeded`` as the kernel reports it)."""

    @abstractmethod
    def close(self) -> None:
        """Kill everything the job started and remove its workspace; never raises."""


PROTECTIONS_TTL_S = 10.0


class Backend(ABC):
    name: str = "abstract"

    def __init__(self, config: CommonConfig) -> None:
        self.allow_weaker = config.allow_weaker
        # Off by default: on the host backends `network: true` means the host's network,
        # loopback services (the broker) included; only an operator turns it on.
        self.allow_network = config.allow_network
        self.worker = config.worker

    @abstractmethod
    def protections(self) -> list[Protection]:
        """What this backend really gives on this host (for `sandfarm doctor`)."""

    @abstractmethod
    def open_session(self, spec: JobSpec) -> AbstractContextManager[Session]: ...

    def close(self) -> None:  # noqa: B027 - optional hook; most backends hold nothing
        """Release what the backend holds between jobs (slots, pools); idempotent."""

    def ensure_available(self) -> None:  # noqa: B027 - optional hook
        """Raise BackendUnavailableError (saying what to do) where this backend cannot run
        at all here: no engine, no binary. Job-level protections are check()'s."""

    def required_protections(self, spec: JobSpec) -> list[str]:
        required = ["tree_kill", "uid_isolation"]
        if not spec.limits.network:
            required.append("network_isolation")
        return required

    def check(self, spec: JobSpec) -> None:
        """Refuse a job the policy forbids, or whose required protection is missing here
        (unless allowed weaker)."""
        if spec.limits.network and not self.allow_network:
            raise PolicyError(
                "limits.network", "network access is not allowed here (SANDFARM_ALLOW_NETWORK)"
            )
        if self.allow_weaker:
            return
        active = self._active_protections()
        for name in self.required_protections(spec):
            protection = active.get(name)
            if protection is None or not protection.active:
                detail = protection.detail if protection else "not offered by this backend"
                raise ProtectionUnavailableError(name, detail)

    def _active_protections(self) -> dict[str, Protection]:
        """protections() by name, asked again at most every PROTECTIONS_TTL_S: what the
        host gives changes with its setup, not job by job (and asking costs ~0.1 ms)."""
        cached = getattr(self, "_protections_seen", None)
        now = time.monotonic()
        if cached is None or now - cached[0] > PROTECTIONS_TTL_S:
            cached = (now, {p.name: p for p in self.protections()})
            self._protections_seen = cached
        return cached[1]

    # --- the public logic ---------------------------------------------------------

    def run(
        self,
        spec: JobSpec,
        *,
        cancel: threading.Event | None = None,
        queued_at: datetime | None = None,
    ) -> JobResult:
        """Run a validated job to a final JobResult. Job problems never raise."""
        started_at = datetime.now(UTC)
        clock = time.monotonic()
        result = JobResult(
            id=spec.id,
            status=Status.RUNNING,
            backend=self.name,
            worker=self.worker,
            labels=spec.labels,
            timings=Timings(queued_at=queued_at, started_at=started_at),
        )
        phases = result.timings.phases
        lap = Lap()
        collect_note: str | None = None
        try:
            self.check(spec)
            with self.open_session(spec) as session:
                # the wait for this process's last session to be torn down is not the
                # job's: its timeout counts from the slot's being ready (an attack review)
                deadline = clock + spec.limits.timeout_s + (session.slot_wait_ms or 0.0) / 1000
                session.write_files({p: c.encode() for p, c in spec.files.items()})
                phases.slot_wait_ms = session.slot_wait_ms
                phases.setup_ms = lap() - (session.slot_wait_ms or 0.0)
                self._run_steps(session, spec, deadline, cancel, result.steps)
                phases.steps_ms = lap()
                phases.prewarmed = session.prewarmed
                try:
                    result.files, result.files_omitted = session.collect(spec.collect)
                except CollectStoppedError as exc:  # what it found stands, and why it stopped
                    result.files, result.files_omitted = exc.files, exc.omitted
                    collect_note = str(exc)
                except (SandfarmError, OSError) as exc:  # the steps' results still stand
                    collect_note = f"collecting files failed: {exc}"
                phases.collect_ms = lap()
            phases.teardown_ms = lap()
            result.status = job_status(result.steps)
            # the steps' word first; collect's after it (a review: a timed-out job read
            # only "collect stopped")
            said = [status_message(result.steps, result.status), collect_note]
            result.message = "; ".join(m for m in said if m) or None
        except (ProtectionUnavailableError, PolicyError) as exc:
            result.status, result.message = Status.REJECTED, str(exc)
        except Exception as exc:  # the farm failed (never the job): keep what ran
            result.status, result.message = Status.ERROR, f"{type(exc).__name__}: {exc}"
        finished_at = datetime.now(UTC)
        result.timings.finished_at = finished_at
        result.timings.run_ms = (time.monotonic() - clock) * 1000
        if queued_at is not None:
            result.timings.queue_wait_ms = (started_at - queued_at).total_seconds() * 1000
        result.resources = ResourceUsage(
            cpu_ms=sum(s.cpu_ms for s in result.steps),
            max_rss_kb=max((s.max_rss_kb for s in result.steps), default=0),
        )
        return bounded(result)

    def _run_steps(
        self,
        session: Session,
        spec: JobSpec,
        deadline: float,
        cancel: threading.Event | None,
        results: list[StepResult],
    ) -> None:
        """Run the steps in order, appending each result as it ends."""
        stop_reason: str | None = None
        for index, step in enumerate(spec.steps):
            if stop_reason is None and time.monotonic() >= deadline:
                stop_reason = DEADLINE_PASSED
            if stop_reason is None and cancel is not None and cancel.is_set():
                stop_reason = CANCELLED_BETWEEN_STEPS
            if stop_reason is None and not session.alive:
                stop_reason = "the sandbox was killed"
            skipped = StepResult(kind=step.kind, status=StepStatus.SKIPPED, check=step.check)
            if stop_reason is not None:
                results.append(skipped.model_copy(update={"message": stop_reason}))
                continue
            try:
                result = self._run_step(session, step, index, spec.limits, deadline, cancel)
            except Exception as exc:  # the farm failed in this step: say where, keep the rest
                message = f"farm failure: {type(exc).__name__}: {exc}"
                results.append(skipped.model_copy(update={"message": message}))
                raise
            result.check = step.check
            results.append(result)
            if result.status in (StepStatus.TIMED_OUT, StepStatus.CANCELLED):
                stop_reason = f"step {index} {result.status.value}"
            elif spec.stop_on_error and result.status != StepStatus.SUCCEEDED and counts(result):
                stop_reason = f"stop_on_error after step {index} {result.status.value}"

    def _run_step(
        self,
        session: Session,
        step: BashStep | PythonStep | WriteFileStep | ReadFileStep,
        index: int,
        limits: Limits,
        deadline: float,
        cancel: threading.Event | None,
    ) -> StepResult:
        began = time.monotonic()
        if isinstance(step, WriteFileStep | ReadFileStep):
            result = _file_step(session, step, limits)
            result.duration_ms = (time.monotonic() - began) * 1000
            return result
        assert isinstance(step, BashStep | PythonStep)
        outcome = session.exec(step, index, deadline, cancel)
        status, message = classify(outcome, limits)
        stdout, stderr = outcome.stdout.render(), outcome.stderr.render()
        if status == StepStatus.SUCCEEDED and step.expected_stdout is not None:
            wrong = mismatch(stdout.text, stdout.truncated, step.expected_stdout, step.compare)
            if wrong is not None:
                status, message = StepStatus.WRONG_ANSWER, wrong
        return StepResult(
            kind=step.kind,
            status=status,
            exit_code=outcome.exit_code,
            signal=outcome.signal,
            stdout=stdout.text,
            stderr=stderr.text,
            stdout_bytes=outcome.stdout.total,
            stderr_bytes=outcome.stderr.total,
            truncated=stdout.truncated or stderr.truncated,
            spawn_ms=outcome.spawn_ms,
            duration_ms=outcome.duration_ms,
            message=message,
            cpu_ms=outcome.cpu_ms,
            max_rss_kb=outcome.max_rss_kb,
        )


class Lap:
    """Milliseconds since the last call (or since it was made)."""

    def __init__(self) -> None:
        self.last = time.monotonic()

    def __call__(self) -> float:
        now = time.monotonic()
        elapsed, self.last = (now - self.last) * 1000, now
        return elapsed


def _file_step(session: Session, step: WriteFileStep | ReadFileStep, limits: Limits) -> StepResult:
    try:
        if isinstance(step, WriteFileStep):
            session.write_file(step.path, step.content.encode())
            return StepResult(kind=step.kind, status=StepStatus.SUCCEEDED, exit_code=0)
        buffer = HeadTailBuffer(limits.output_bytes, limits.head_ratio)
        session.read_into(step.path, buffer)
        content = buffer.render()
        return StepResult(
            kind=step.kind,
            status=StepStatus.SUCCEEDED,
            exit_code=0,
            stdout=content.text,
            stdout_bytes=buffer.total,
            truncated=content.truncated,
        )
    except (OSError, SandfarmError) as exc:
        reason = getattr(exc, "reason", None) or getattr(exc, "strerror", None) or str(exc)
        return StepResult(
            kind=step.kind, status=StepStatus.FAILED, exit_code=1, message=f"{step.path}: {reason}"
        )

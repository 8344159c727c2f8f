"""What happened, read as what it means: a step's status from its process's outcome, the
job's status and message from its steps, and the result's byte bound as serialised."""

from __future__ import annotations

import signal

from sandbox_core import defaults as d
from sandbox_core.models import JobResult, Limits, Status, StepResult, StepStatus
from sandbox_core.runner import ExecOutcome


def classify(outcome: ExecOutcome, limits: Limits) -> tuple[StepStatus, str | None]:
    """Map what happened to a process onto the one status that describes it.

    Only what the farm or the kernel says counts (the farm's own deadline, flood and
    cancel; the process's real wait status; the CPU time it used; the memory cgroup's
    OOM kills), never anything the job chose: an exit code, a signal it sent itself
    without using the CPU, or an error message it printed."""
    if outcome.cancelled:
        return StepStatus.CANCELLED, "cancelled"
    if outcome.flooded:
        return StepStatus.OUTPUT_FLOODED, f"wrote more than {limits.flood_kill_bytes} bytes"
    if outcome.watch_stopped:  # TCP memory the kernel let it hold past its bound
        return StepStatus.MEMORY_EXCEEDED, outcome.stopped_why
    if outcome.timed_out:
        return StepStatus.TIMED_OUT, f"wall-clock limit of {limits.timeout_s:g}s reached"
    # The kernel signals a process once its CPU time passes the limit, as counted in
    # ticks; the time reported back may read a little under it.
    cpu_spent = outcome.cpu_ms >= limits.cpu_s * 1000 * CPU_LIMIT_TOLERANCE
    if outcome.signal in (signal.SIGXCPU, signal.SIGKILL) and cpu_spent:
        return StepStatus.TIMED_OUT, f"CPU limit of {limits.cpu_s}s reached"
    if outcome.exit_code == 0:
        return StepStatus.SUCCEEDED, None
    if outcome.farm_memory_bound:  # an OOM kill short of the job's own limit
        return StepStatus.MEMORY_EXCEEDED, (
            "the farm's memory bound for all jobs together was reached"
            f" (this job's own limit of {limits.memory_mb} MB was not)"
        )
    if outcome.memory_exceeded:
        return StepStatus.MEMORY_EXCEEDED, f"memory limit of {limits.memory_mb} MB reached"
    if outcome.exit_code is not None:
        return StepStatus.FAILED, None
    try:
        name = signal.Signals(outcome.signal or 0).name
    except ValueError:  # real-time and unnamed signals
        name = f"signal {outcome.signal}"
    if outcome.signal == signal.SIGXFSZ:
        return (
            StepStatus.CRASHED,
            f"killed by {name} (the file size limit is {limits.file_size_mb} MB)",
        )
    return StepStatus.CRASHED, f"killed by {name}"


CPU_LIMIT_TOLERANCE = 0.9


def bounded(result: JobResult, limit: int = d.MAX_RESULT_BYTES) -> JobResult:
    """The result within ``limit`` bytes as serialised. Each stream and file is bounded
    as it serialises already; names, messages and many steps could still add up, so the
    collected files go first, then the steps' output (the statuses always stay)."""
    if json_upper_bound(result) <= limit or _json_bytes(result) <= limit:
        return result
    if result.files:
        result.files_omitted += len(result.files)
        result.files = []
        result.message = (result.message or "") + " (collected files dropped: result bound)"
        if _json_bytes(result) <= limit:
            return result
    for step in result.steps:
        omitted = len(step.stdout) + len(step.stderr)
        step.stdout = step.stderr = f"[... {omitted} characters dropped: result bound ...]"
        step.truncated = True
    return result


def _json_bytes(result: JobResult) -> int:
    # bytes, not characters: Redis stores the UTF-8 (a CJK or U+FFFD character is 3)
    return len(result.model_dump_json().encode())


# What a result's JSON holds besides its texts, at most: keys, numbers, flags, times.
_RESULT_FIXED, _STEP_FIXED, _FILE_FIXED = 4096, 1024, 256


def json_upper_bound(result: JobResult) -> int:
    """Bytes the result's JSON cannot exceed, without serialising it: each character of
    its texts is at most 6 bytes (a control character's \\u escape), plus the fixed
    parts (tests/unit/test_result_bound.py fills every text field to check it)."""
    chars = len(result.id or "") + len(result.message or "")
    chars += len(result.backend or "") + len(result.worker or "")
    chars += sum(len(k) + len(v) for k, v in result.labels.items())
    for step in result.steps:
        chars += len(step.kind) + len(step.stdout) + len(step.stderr) + len(step.message or "")
    for file in result.files:
        chars += len(file.path) + len(file.content)
    fixed = _RESULT_FIXED + _STEP_FIXED * len(result.steps) + _FILE_FIXED * len(result.files)
    return 6 * chars + fixed


_SEVERITY = [
    StepStatus.CANCELLED,
    StepStatus.TIMED_OUT,
    StepStatus.MEMORY_EXCEEDED,
    StepStatus.OUTPUT_FLOODED,
    StepStatus.CRASHED,
    StepStatus.FAILED,
    StepStatus.WRONG_ANSWER,
]


_UNCHECKED_OK = (StepStatus.FAILED, StepStatus.CRASHED, StepStatus.WRONG_ANSWER)


def counts(step: StepResult) -> bool:
    return step.check or step.status not in _UNCHECKED_OK


# Why a step was skipped, where that decides the job's status: a job whose deadline
# passed or that was cancelled before a step ran did not succeed, though no step it ran
# failed (all its steps skipped, it read `succeeded`: an attack review).
DEADLINE_PASSED = "the job's deadline passed"
CANCELLED_BETWEEN_STEPS = "the job was cancelled"
_SKIPPED_AS = {DEADLINE_PASSED: StepStatus.TIMED_OUT, CANCELLED_BETWEEN_STEPS: StepStatus.CANCELLED}


def _ended_as(step: StepResult) -> StepStatus:
    if step.status == StepStatus.SKIPPED:
        return _SKIPPED_AS.get(step.message or "", StepStatus.SKIPPED)
    return step.status


def job_status(steps: list[StepResult]) -> Status:
    """The job's status: the first abnormal end (by severity) among the steps that count
    (a ``check: false`` step's failure does not; its limits still do), a step skipped
    for the deadline or a cancel counting as timed out or cancelled."""
    seen = {_ended_as(step) for step in steps if counts(step)}
    for status in _SEVERITY:
        if status in seen:
            return Status(status.value)
    return Status.SUCCEEDED


def status_message(steps: list[StepResult], status: Status) -> str | None:
    """Which step decided a job's status, and how: "step 2 (bash) exited 1"."""
    if status == Status.SUCCEEDED:
        return None
    for index, step in enumerate(steps):
        if _ended_as(step).value != status.value or not counts(step):
            continue
        if step.status == StepStatus.FAILED and step.exit_code is not None and not step.message:
            return f"step {index} ({step.kind}) exited {step.exit_code}"
        return f"step {index} ({step.kind}) {step.status.value}: {step.message or ''}".rstrip(": ")
    return None

"""The job contract: JobSpec in, JobResult out. Shared by every component."""

from __future__ import annotations

import re
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    model_validator,
)

from sandbox_core import defaults as d
from sandbox_core.errors import PathEscapeError, SpecError
from sandbox_core.pathguard import check_relative_path

BackendName = Literal["process", "bwrap", "docker"]


class Status(StrEnum):
    """One meaning per status, on every backend."""

    SUCCEEDED = "succeeded"  # every step exited 0
    FAILED = "failed"  # a step exited non-zero
    TIMED_OUT = "timed_out"  # wall-clock or CPU limit reached
    MEMORY_EXCEEDED = "memory_exceeded"  # memory limit reached (OOM kill or allocation failure)
    OUTPUT_FLOODED = "output_flooded"  # a step wrote more than flood_kill_bytes and was killed
    CRASHED = "crashed"  # killed by a signal it did not ask for
    WRONG_ANSWER = "wrong_answer"  # every step exited 0, but a step's stdout was not expected
    REJECTED = "rejected"  # the spec broke a policy or limit; nothing ran
    ERROR = "error"  # the farm failed (after retries)
    CANCELLED = "cancelled"  # cancelled by the client
    QUEUED = "queued"  # in flight: waiting for a worker
    RUNNING = "running"  # in flight: in a sandbox

    @property
    def is_final(self) -> bool:
        return self not in (Status.QUEUED, Status.RUNNING)


class StepStatus(StrEnum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    MEMORY_EXCEEDED = "memory_exceeded"
    OUTPUT_FLOODED = "output_flooded"
    CRASHED = "crashed"
    WRONG_ANSWER = "wrong_answer"  # exited 0, but its stdout differs from expected_stdout
    CANCELLED = "cancelled"
    SKIPPED = "skipped"  # not run: stop_on_error after a failure, or the deadline passed


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=False)


def _utf8(value: str) -> bytes:
    # JSON can carry a lone surrogate ("\\ud800"); no file, argv or message can hold one
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("is not valid Unicode text (it holds a lone surrogate)") from None


def _unicode(value: str) -> str:
    _utf8(value)
    return value


def _relative_path(value: str) -> str:
    try:
        return check_relative_path(value)
    except PathEscapeError as exc:
        raise ValueError(exc.reason) from None


def _glob_pattern(value: str) -> str:
    # A glob is checked like a path: no absolute patterns, no "..", no NUL; and short
    # (collectmatch.py says why).
    size = len(_utf8(value))
    if size > d.COLLECT_MAX_PATTERN_BYTES:
        raise ValueError(f"is {size} bytes; the maximum is {d.COLLECT_MAX_PATTERN_BYTES}")
    try:
        check_relative_path(value)
    except PathEscapeError as exc:
        raise ValueError(exc.reason) from None
    return value


def _bounded_text(limit: int):
    def check(value: str) -> str:
        size = len(_utf8(value))
        if size > limit:
            raise ValueError(f"is {size} bytes; the maximum is {limit}")
        if "\x00" in value:
            raise ValueError("contains a NUL byte")
        return value

    return AfterValidator(check)


Text = Annotated[str, AfterValidator(_unicode)]
RelPath = Annotated[str, AfterValidator(_unicode), AfterValidator(_relative_path)]
GlobPattern = Annotated[str, AfterValidator(_unicode), AfterValidator(_glob_pattern)]
Source = Annotated[str, _bounded_text(d.MAX_SOURCE_BYTES)]
Stdin = Annotated[Text | None, Field(default=None, max_length=d.MAX_SOURCE_BYTES)]


class _Step(_Strict):
    check: bool = Field(
        True,
        description="false: this step failing (non-zero exit, crash) does not fail the job;"
        " its own status is still recorded, and limits (time, memory, output) still count",
    )


Compare = Literal["exact", "whitespace"]


class _ExecStep(_Step):
    stdin: Stdin = None
    expected_stdout: Source | None = Field(
        None,
        description="the stdout this step must print; a step that exits 0 with other"
        " output is wrong_answer (at most limits.output_bytes)",
    )
    compare: Compare = Field(
        "exact",
        description="exact: byte for byte; whitespace: the same words, however spaced",
    )

    @model_validator(mode="after")
    def _compare_needs_expected(self) -> _ExecStep:
        if self.compare != "exact" and self.expected_stdout is None:
            raise SpecError("compare", "only applies with expected_stdout")
        return self


class BashStep(_ExecStep):
    kind: Literal["bash"] = "bash"
    command: Source = Field(min_length=1)


class PythonStep(_ExecStep):
    kind: Literal["python"] = "python"
    code: Source = Field(min_length=1)


class WriteFileStep(_Step):
    kind: Literal["write_file"] = "write_file"
    path: RelPath
    content: Source = ""


class ReadFileStep(_Step):
    kind: Literal["read_file"] = "read_file"
    path: RelPath


Step = Annotated[BashStep | PythonStep | WriteFileStep | ReadFileStep, Field(discriminator="kind")]
ExecStep = BashStep | PythonStep


class Limits(_Strict):
    """Per-job limits; each has a default and a farm-wide maximum (sandbox_core.defaults)."""

    timeout_s: float = Field(d.TIMEOUT_S[0], gt=0, le=d.TIMEOUT_S[1])
    cpu_s: int = Field(d.CPU_S[0], ge=1, le=d.CPU_S[1])
    memory_mb: int = Field(d.MEMORY_MB[0], ge=32, le=d.MEMORY_MB[1])
    processes: int = Field(d.PROCESSES[0], ge=1, le=d.PROCESSES[1])
    open_files: int = Field(d.OPEN_FILES[0], ge=16, le=d.OPEN_FILES[1])
    file_size_mb: int = Field(d.FILE_SIZE_MB[0], ge=1, le=d.FILE_SIZE_MB[1])
    output_bytes: int = Field(d.OUTPUT_BYTES[0], ge=64, le=d.OUTPUT_BYTES[1])
    head_ratio: float = Field(d.HEAD_RATIO, ge=0.0, le=1.0)
    flood_kill_bytes: int = Field(d.FLOOD_KILL_BYTES[0], ge=1024, le=d.FLOOD_KILL_BYTES[1])
    network: bool = False
    workspace_mb: int = Field(d.WORKSPACE_MB[0], ge=1, le=d.WORKSPACE_MB[1])
    cpus: float = Field(d.CPUS[0], ge=0.05, le=d.CPUS[1])
    ptys: int = Field(d.PTYS[0], ge=1, le=d.PTYS[1])


_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$")
_PLAIN_LABEL_RE = re.compile(r"[A-Za-z0-9._:@/-]*")
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
# The task message is decoded by kombu, whose JSON decoder turns a map of exactly these
# keys into a typed value (Decimal, datetime...) or fails the message: the job came back
# `rejected` by a worker where the same spec, taken by a chain, ran (a review).
_KOMBU_TYPED = {"__type__", "__value__"}


class JobSpec(_Strict):
    """What to run. ``code`` / ``command`` are one-step shorthands for ``steps``."""

    id: str | None = Field(None, description="client idempotency key")
    backend: BackendName | None = Field(None, description="None: the worker's default")
    image: Text | None = Field(None, max_length=256, description="docker backend only")
    steps: list[Step] = Field(default_factory=list, max_length=d.MAX_STEPS)
    code: Source | None = Field(None, description="shorthand: one python step")
    command: Source | None = Field(None, description="shorthand: one bash step")
    stop_on_error: bool = Field(False, description="stop at the first step that does not succeed")
    files: dict[RelPath, Source] = Field(default_factory=dict, max_length=d.MAX_SEED_FILES)
    env: dict[str, Text] = Field(default_factory=dict, max_length=d.MAX_ENV_VARS)
    limits: Limits = Field(default_factory=Limits)
    collect: list[GlobPattern] = Field(default_factory=list, max_length=d.MAX_COLLECT_PATTERNS)
    labels: dict[Text, Text] = Field(default_factory=dict, max_length=d.MAX_LABELS)

    @model_validator(mode="after")
    def _normalise(self) -> JobSpec:
        if self.id is not None and not _ID_RE.fullmatch(self.id):
            raise SpecError("id", "must be 1-128 of [A-Za-z0-9._:@-], starting alphanumeric")
        shorthands = [name for name in ("code", "command") if getattr(self, name) is not None]
        if shorthands and self.steps:
            raise SpecError(shorthands[0], "give either steps or a one-step shorthand, not both")
        if len(shorthands) > 1:
            raise SpecError("command", "give either code or command, not both")
        if self.code is not None:
            self.steps = [PythonStep(code=self.code)]
            self.code = None
        if self.command is not None:
            self.steps = [BashStep(command=self.command)]
            self.command = None
        if not self.steps:
            raise SpecError("steps", "the job is empty: give steps, code or command")
        seeded = sum(len(v.encode()) for v in self.files.values())
        if seeded > d.MAX_SEED_BYTES:
            raise SpecError("files", f"{seeded} bytes in all; the maximum is {d.MAX_SEED_BYTES}")
        for name in ("env", "labels", "files"):  # kombu's JSON decoder takes such a map
            if set(getattr(self, name)) == _KOMBU_TYPED:  # for a typed value (a review)
                raise SpecError(name, "the keys __type__ and __value__ alone are reserved")
        env_bytes = sum(len(k.encode()) + len(v.encode()) + 2 for k, v in self.env.items())
        if env_bytes > d.MAX_ENV_BYTES:
            raise SpecError("env", f"{env_bytes} bytes in all; the maximum is {d.MAX_ENV_BYTES}")
        for name, value in self.env.items():
            if not _ENV_NAME_RE.fullmatch(name):
                raise SpecError(f"env.{name}", "not a valid environment variable name")
            if len(value.encode()) > d.MAX_ENV_VALUE_BYTES or "\x00" in value:
                raise SpecError(f"env.{name}", "value too long or contains NUL")
        for key, value in self.labels.items():
            if len(key.encode()) > d.MAX_LABEL_BYTES or len(value.encode()) > d.MAX_LABEL_BYTES:
                raise SpecError(f"labels.{key}", f"key and value are at most {d.MAX_LABEL_BYTES} B")
        for index, step in enumerate(self.steps):
            expected = getattr(step, "expected_stdout", None)
            if expected is not None and len(expected.encode()) > self.limits.output_bytes:
                raise SpecError(
                    f"steps.{index}.expected_stdout",
                    f"is {len(expected.encode())} bytes, more than limits.output_bytes"
                    f" ({self.limits.output_bytes}): the output kept could never match it",
                )
        worst = len(self.steps) * 2 * self.limits.output_bytes + d.COLLECT_MAX_TOTAL_BYTES
        if worst > d.MAX_RESULT_BYTES:
            raise SpecError(
                "limits.output_bytes",
                f"{len(self.steps)} steps x 2 streams x {self.limits.output_bytes} B could exceed"
                f" the result bound of {d.MAX_RESULT_BYTES} B",
            )
        if self.image is not None and self.backend not in (None, "docker"):
            raise SpecError("image", "only the docker backend takes an image")
        return self

    def summary(self, tenant: str | None = None) -> str:
        """A short, code-free description for logs and Flower."""
        kinds = ",".join(step.kind for step in self.steps)
        labels = " ".join(f"{_shown(k)}={_shown(v)}" for k, v in list(self.labels.items())[:4])
        who = f"tenant={tenant} " if tenant else ""
        backend = self.backend or "default"
        return f"{who}job={self.id or '-'} backend={backend} steps=[{kinds}] {labels}"


def _shown(text: str) -> str:
    """A label's key or value as a summary line shows it: plain, or quoted with escapes
    (a tenant's newline or "x tenant=bob" faked lines and names in Flower: a review)."""
    return text if _PLAIN_LABEL_RE.fullmatch(text) else repr(text)


class StepResult(_Strict):
    kind: str
    status: StepStatus
    check: bool = True  # false: its failure did not count towards the job's status
    exit_code: int | None = None
    signal: int | None = None
    stdout: str = ""
    stderr: str = ""
    stdout_bytes: int = 0
    stderr_bytes: int = 0
    truncated: bool = False
    spawn_ms: float = 0.0  # starting the process (fork, exec of the wrapper)
    duration_ms: float = 0.0
    cpu_ms: float = 0.0
    max_rss_kb: int = 0
    message: str | None = None


class CollectedFile(_Strict):
    path: str
    size: int
    encoding: Literal["utf-8", "base64"] = "utf-8"
    content: str
    truncated: bool = False


class Phases(_Strict):
    """Where a job's time went, in ms; None where a path does not measure it. The farm's
    phases (dispatch, delivery, store) use the Redis host's clock against the worker's."""

    dispatch_ms: float | None = Field(None, description="accepted -> moved to the Celery queue")
    delivery_ms: float | None = Field(None, description="moved -> a worker began it")
    slot_wait_ms: float | None = Field(None, description="waiting for a free sandbox slot")
    setup_ms: float | None = Field(None, description="workspace, limits, seeded files")
    steps_ms: float | None = Field(None, description="every step: spawn, run, cleanup")
    collect_ms: float | None = Field(None, description="collecting files")
    teardown_ms: float | None = Field(None, description="removing the sandbox")
    store_ms: float | None = Field(None, description="finished -> stored in Redis")
    prewarmed: bool | None = Field(
        None, description="the first step ran in a sandbox set up before the job arrived"
    )


class Timings(_Strict):
    queued_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    queue_wait_ms: float | None = None
    run_ms: float | None = None
    phases: Phases = Field(default_factory=Phases)


class ResourceUsage(_Strict):
    cpu_ms: float = 0.0
    max_rss_kb: int = 0


class JobResult(_Strict):
    id: str | None = None
    status: Status
    message: str | None = None
    steps: list[StepResult] = Field(default_factory=list)
    files: list[CollectedFile] = Field(default_factory=list)
    files_omitted: int = 0
    timings: Timings = Field(default_factory=Timings)
    backend: str | None = None
    worker: str | None = None
    attempts: int = 0
    resources: ResourceUsage = Field(default_factory=ResourceUsage)
    labels: dict[str, str] = Field(default_factory=dict)

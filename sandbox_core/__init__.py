"""sandbox_core: run untrusted code in a bounded, locked-down sandbox. No Celery, no Redis."""

from __future__ import annotations

from sandbox_core.backends import BACKEND_NAMES, Backend, Protection, get_backend
from sandbox_core.errors import (
    BackendUnavailableError,
    PathEscapeError,
    PolicyError,
    ProtectionUnavailableError,
    SandfarmError,
    SlotBusyError,
    SpecError,
)
from sandbox_core.models import (
    BashStep,
    CollectedFile,
    JobResult,
    JobSpec,
    Limits,
    PythonStep,
    ReadFileStep,
    Status,
    StepResult,
    StepStatus,
    WriteFileStep,
)
from sandbox_core.output import HeadTailBuffer
from sandbox_core.validation import parse_spec

__all__ = [
    "BACKEND_NAMES",
    "Backend",
    "BackendUnavailableError",
    "BashStep",
    "CollectedFile",
    "HeadTailBuffer",
    "JobResult",
    "JobSpec",
    "Limits",
    "PathEscapeError",
    "PolicyError",
    "Protection",
    "ProtectionUnavailableError",
    "PythonStep",
    "ReadFileStep",
    "SandfarmError",
    "SlotBusyError",
    "SpecError",
    "Status",
    "StepResult",
    "StepStatus",
    "WriteFileStep",
    "get_backend",
    "parse_spec",
]

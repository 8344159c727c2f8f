"""One exception root for all of sandfarm; each error also subclasses the matching built-in
and carries its data as attributes, not only as text.

    SandfarmError
    ├── SpecError (ValueError)                    a job spec broke the contract: field, reason
    ├── PathEscapeError (PermissionError)         a workspace path tried to leave: path, reason
    ├── PolicyError (PermissionError)             the farm's policy forbids it: field, reason
    ├── ProtectionUnavailableError (PermissionError)  a required protection is missing here
    ├── BackendUnavailableError (RuntimeError)    the backend cannot run on this host at all
    ├── SlotBusyError (TimeoutError)              no sandbox slot became free in time
    ├── CollectStoppedError                       collect's matching ran out of time: the
    │                                             files found before, and how many omitted
    ├── SyscallPolicyError (ValueError)           the seccomp policy names an unknown call
    └── FarmError                                 the farm's own (producer.protocol.errors):
        ├── FarmUnavailableError (ConnectionError)    Redis does not answer: url, cause
        ├── SlotReservationError (RuntimeError)       no block of free slots for a worker
        ├── IdConflictError (ValueError)              a job id already names another spec
        ├── TenantError (ValueError)                  no such tenant, a bad name or policy
        ├── TenantsFileError (ValueError)             a tenants export unreadable: path, reason
        ├── QuotaError (RuntimeError)                 over a tenant's rate, queue or budget
        ├── AuthError (PermissionError)               the gateway refused the API key
        ├── JobsLostError (LookupError)               jobs waited on that the farm forgot
        ├── LateStepError (TimeoutError)              a chain took a job too late for it
        └── InputChangedError (RuntimeError)          a batch input changed mid-run

Job problems (a job that fails, times out, floods) are never raised: they are statuses.
"""

from __future__ import annotations

from typing import Any

from sandbox_core import defaults as d


class SandfarmError(Exception):
    """Root of every error sandfarm raises on purpose."""


class SpecError(SandfarmError, ValueError):
    """A job spec broke the contract; ``field`` names the offending field."""

    def __init__(self, field: str, reason: str, value: object = None) -> None:
        self.field = field
        self.reason = reason
        self.value = value
        super().__init__(f"{field}: {reason}")


class PathEscapeError(SandfarmError, PermissionError):
    """A workspace path tried to leave the workspace."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"path {path!r} refused: {reason}")


class ProtectionUnavailableError(SandfarmError, PermissionError):
    """The backend cannot give a protection the job requires, so it refuses the job."""

    def __init__(self, protection: str, reason: str) -> None:
        self.protection = protection
        self.reason = reason
        super().__init__(f"protection {protection!r} unavailable: {reason}")


class PolicyError(SandfarmError, PermissionError):
    """The job asks for something this farm's policy does not allow (e.g. network)."""

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(f"{field}: {reason}")


class BackendUnavailableError(SandfarmError, RuntimeError):
    """The backend cannot run at all on this host (missing engine, binary, privilege)."""


class SlotBusyError(SandfarmError, TimeoutError):
    """No sandbox slot became free in time."""

    def __init__(self, index: int | None, waited_s: float) -> None:
        self.index = index
        self.waited_s = waited_s
        which = f"sandbox slot {index} not" if index is not None else "no sandbox slot"
        super().__init__(f"{which} free after {waited_s:.0f}s")


class CollectStoppedError(SandfarmError):
    """Collect matched patterns for its whole time (defaults.COLLECT_MATCH_S) and stopped:
    ``files`` and ``omitted`` are what it found before."""

    def __init__(self, files: list[Any], omitted: int) -> None:
        self.files, self.omitted = files, omitted
        super().__init__(
            f"collect stopped after {d.COLLECT_MATCH_S:g} s of matching its patterns:"
            " files past that were not looked at"
        )

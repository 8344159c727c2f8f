"""One exception root for sandbox_core; each error also subclasses the matching built-in."""

from __future__ import annotations


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

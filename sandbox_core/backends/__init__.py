"""Backends: where a job runs. Each shares the interface in ``base``."""

from __future__ import annotations

from sandbox_core.backends.base import Backend, Protection, Session

BACKEND_NAMES = ("process", "bwrap", "docker")


def get_backend(name: str, **options: object) -> Backend:
    """Build a backend by name; imports lazily so a missing optional part only hurts its user."""
    if name == "process":
        from sandbox_core.backends.process import ProcessBackend

        return ProcessBackend(**options)  # type: ignore[arg-type]
    if name == "bwrap":
        from sandbox_core.backends.bwrap import BwrapBackend

        return BwrapBackend(**options)  # type: ignore[arg-type]
    if name == "docker":
        from sandbox_core.backends.docker import DockerBackend

        return DockerBackend(**options)  # type: ignore[arg-type]
    raise ValueError(f"unknown backend {name!r}; choose one of {', '.join(BACKEND_NAMES)}")


__all__ = ["BACKEND_NAMES", "Backend", "Protection", "Session", "get_backend"]

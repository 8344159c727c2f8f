"""Backends: where a job runs. Each shares the interface in ``base`` and takes one typed
configuration (``config``)."""

from __future__ import annotations

from sandbox_core.backends.base import Backend, Protection, Session
from sandbox_core.backends.config import (
    BackendConfig,
    BwrapConfig,
    DockerConfig,
    ProcessConfig,
    backend_config,
)
from sandbox_core.errors import SpecError

BACKEND_NAMES = ("process", "bwrap", "docker")


def get_backend(
    backend: str | ProcessConfig | BwrapConfig | DockerConfig, **fields: object
) -> Backend:
    """Build a backend from its config, or from its name and config fields (validated:
    an unknown field is an error). Imports lazily, so a missing optional part (the Docker
    SDK) only hurts its user."""
    if isinstance(backend, str):
        if backend not in BACKEND_NAMES:
            raise SpecError(
                "backend", f"unknown backend {backend!r}; choose one of {BACKEND_NAMES}"
            )
        config = backend_config(backend, **fields)
    else:
        config = backend_config(backend.type, **{**dict(backend), **fields})
    if isinstance(config, ProcessConfig):
        from sandbox_core.backends.process import ProcessBackend

        return ProcessBackend(config)
    if isinstance(config, BwrapConfig):
        from sandbox_core.backends.bwrap import BwrapBackend

        return BwrapBackend(config)
    from sandbox_core.backends.docker import DockerBackend

    return DockerBackend(config)


__all__ = [
    "BACKEND_NAMES",
    "Backend",
    "BackendConfig",
    "BwrapConfig",
    "DockerConfig",
    "ProcessConfig",
    "Protection",
    "Session",
    "backend_config",
    "get_backend",
]

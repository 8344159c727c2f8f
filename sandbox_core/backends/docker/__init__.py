"""L3, the Docker backend: containers (profile, owners, reaping), the warm pool and the
remover, sessions (exec, sweep), file transfer and Docker's stream framing."""

from __future__ import annotations

from sandbox_core.backends.docker.backend import DockerBackend
from sandbox_core.backends.docker.containers import reap_orphans

__all__ = ["DockerBackend", "reap_orphans"]

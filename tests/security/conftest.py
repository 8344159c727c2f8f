"""The attack suite runs against every backend: a backend joins by adding its name here."""

from __future__ import annotations

import shutil

import pytest

from sandbox_core import Backend, JobResult, get_backend, parse_spec
from tests.conftest import require

BACKENDS = ["process", "bwrap", "docker"]


def _available(name: str) -> tuple[bool, str]:
    if name == "bwrap" and shutil.which("bwrap") is None:
        return False, "bubblewrap is not installed"
    if name == "docker":
        try:
            import docker

            docker.from_env(timeout=3).ping()
        except Exception as exc:  # any failure to reach the engine means "no engine"
            return False, f"no Docker engine answers: {exc}"
    return True, ""


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> Backend:
    ok, reason = _available(request.param)
    require(ok, reason)
    return get_backend(request.param)


@pytest.fixture
def run(backend: Backend):
    """Run a job given as a dict (or shorthand keyword arguments) on the backend."""

    def _run(spec: dict | None = None, **kwargs: object) -> JobResult:
        return backend.run(parse_spec({**(spec or {}), **kwargs}))

    return _run

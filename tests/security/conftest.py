"""The attack suite runs against every backend: a backend joins by adding its name here."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest

from sandbox_core import Backend, JobResult, get_backend, parse_spec
from tests.conftest import require

# name -> (backend, options). "docker-runsc" (the docker backend under gVisor) joins
# only with SANDFARM_TEST_GVISOR=1: Debian 12's runsc (20221219, ptrace platform) loses
# its sentry ("WaitPID failed: EOF") on exec'd jobs that fork, on this farm's kernel.
BACKENDS = {
    "process": ("process", {}),
    "bwrap": ("bwrap", {}),
    "docker": ("docker", {}),
}
if os.environ.get("SANDFARM_TEST_GVISOR") == "1":
    BACKENDS["docker-runsc"] = ("docker", {"runtime": "runsc"})
SANDBOX_IMAGE = "sandfarm/sandbox:latest"


def docker_status(runtime: str = "runc") -> tuple[bool, str]:
    """Is there an engine with the sandbox image (and the runtime)? And if not, why."""
    try:
        import docker

        client = docker.from_env(timeout=5)
        info = client.info()
        client.images.get(SANDBOX_IMAGE)
    except Exception as exc:  # any failure to reach the engine or image means "not here"
        return False, f"no Docker engine with {SANDBOX_IMAGE}: {exc}"
    if runtime not in info.get("Runtimes", {}):
        return False, f"the engine has no {runtime} runtime (ops/install_docker.sh registers it)"
    return True, ""


def _available(name: str, options: dict) -> tuple[bool, str]:
    if name == "bwrap" and shutil.which("bwrap") is None:
        return False, "bubblewrap is not installed"
    if name == "docker":
        return docker_status(str(options.get("runtime", "runc")))
    return True, ""


@pytest.fixture(params=list(BACKENDS))
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    name, options = BACKENDS[request.param]
    ok, reason = _available(name, options)
    require(ok, reason)
    sandbox = get_backend(name, **options)
    yield sandbox
    sandbox.close()


@pytest.fixture
def run(backend: Backend):
    """Run a job given as a dict (or shorthand keyword arguments) on the backend."""

    def _run(spec: dict | None = None, **kwargs: object) -> JobResult:
        return backend.run(parse_spec({**(spec or {}), **kwargs}))

    return _run

"""The attack suite runs against every backend: a backend joins by adding its name here.

With ``SANDFARM_TEST_FAKE_BACKEND=<rejected|error|empty|failure>`` every backend a
security test gets is instead a do-nothing fake (tests/security/fakes.py): the suite's
own control, run by tests/meta, where every test must fail. Tests that exercise a kernel
mechanism directly, not a backend, are marked ``no_backend`` and left out of those runs."""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import sandbox_core
import sandbox_core.backends
from sandbox_core import Backend, JobResult, get_backend, parse_spec
from tests.conftest import require
from tests.security.fakes import FAKES, fake_get_backend, fake_kind

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
HERE = Path(__file__).resolve().parent
FAKE = fake_kind()
if FAKE is not None:  # one param, the fake: nothing real is built
    BACKENDS = {f"fake-{FAKE}": ("process", {})}


# Modules whose every test exercises a kernel mechanism directly, never a backend (each
# test there carries its own positive control: the attack is first tried unfiltered)
NO_BACKEND_MODULES = {"test_seccomp_live.py"}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "no_backend: tests a kernel mechanism or a validator directly, with no sandbox"
        " backend (left out of the fake-backend runs of tests/meta)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.name in NO_BACKEND_MODULES and item.path.parent == HERE:
            item.add_marker(pytest.mark.no_backend)


def docker_status(runtime: str = "runc") -> tuple[bool, str]:
    """Is there an engine with the sandbox image (and the runtime)? And if not, why."""
    if FAKE is not None:
        return True, ""
    import docker

    # The backend's own timeout (30 s), and a second try after a timeout: an engine busy
    # for a moment under a loaded suite is not a missing one (and a module-scoped fixture
    # that fails once fails every test of its module). No socket or no image: at once.
    for attempt in (1, 2):
        try:
            client = docker.from_env(timeout=30)
            info = client.info()
            client.images.get(SANDBOX_IMAGE)
            break
        except Exception as exc:  # any failure to reach the engine or image means "not here"
            if attempt == 2 or "timed out" not in str(exc).lower():
                return False, f"no Docker engine with {SANDBOX_IMAGE}: {exc}"
            time.sleep(2)
    if runtime not in info.get("Runtimes", {}):
        return False, f"the engine has no {runtime} runtime (ops/install_docker.sh registers it)"
    return True, ""


def bwrap_status() -> tuple[bool, str]:
    """Can bubblewrap build its namespaces here? And if not, why."""
    if FAKE is not None:
        return True, ""
    from sandbox_core.backends import bwrap

    found = bwrap.probe()
    return found.ok, found.detail


def _available(name: str, options: dict) -> tuple[bool, str]:
    if FAKE is not None:
        return True, ""
    if name == "bwrap" and shutil.which("bwrap") is None:
        return False, "bubblewrap is not installed"
    if name == "docker":
        return docker_status(str(options.get("runtime", "runc")))
    return True, ""


def make_backend(name: str, **options: object) -> Backend:
    """The backend ``name`` (the fake under SANDFARM_TEST_FAKE_BACKEND)."""
    if FAKE is not None:
        return FAKES[FAKE](name, **options)
    return get_backend(name, **options)


@pytest.fixture(scope="session", autouse=True)
def _fake_backends_everywhere() -> Iterator[None]:
    """Under the fake switch, every ``get_backend`` a security test can call builds the
    fake: the library's own and each security test module's imported name."""
    if FAKE is None:
        yield
        return
    fake = fake_get_backend(FAKE)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sandbox_core, "get_backend", fake)
        patch.setattr(sandbox_core.backends, "get_backend", fake)
        for name, module in list(sys.modules.items()):
            if name.startswith("tests.security.") and hasattr(module, "get_backend"):
                patch.setattr(module, "get_backend", fake)
        yield


@pytest.fixture(params=list(BACKENDS))
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    name, options = BACKENDS[request.param]
    ok, reason = _available(name, options)
    require(ok, reason)
    sandbox = make_backend(name, **options)
    yield sandbox
    sandbox.close()


@pytest.fixture
def run(backend: Backend):
    """Run a job given as a dict (or shorthand keyword arguments) on the backend."""

    def _run(spec: dict | None = None, **kwargs: object) -> JobResult:
        return backend.run(parse_spec({**(spec or {}), **kwargs}))

    return _run

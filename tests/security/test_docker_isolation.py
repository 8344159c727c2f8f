"""Docker-only promises: no network at all, read-only image, no root, no capabilities,
nothing left behind on the engine, and orphans of a dead owner reaped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from sandbox_core import Status, parse_spec
from sandbox_core import defaults as d
from sandbox_core.backends.docker.containers import LABEL, reap_orphans
from tests.conftest import require
from tests.security.conftest import docker_status, make_backend
from tests.security.helpers import (
    Listener,
    docker_bridge_gateway,
    docker_client,
    reachable_from_a_networked_container,
)


@pytest.fixture(scope="module")
def docker_backend():
    ok, reason = docker_status()
    require(ok, reason)
    backend = make_backend("docker")
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def client(docker_backend):
    """The engine, as the host sees it (never through the backend under test)."""
    return docker_client()


ROOT = Path(__file__).resolve().parents[2]


def _run(backend, **spec):
    return backend.run(parse_spec(spec))


def managed_containers(client, owner: int | None = None) -> set[str]:
    """Ids of the farm's containers (of this test process, by default: other farms may
    share the engine)."""
    owner = os.getpid() if owner is None else owner
    labels = [f"{LABEL}=1", f"sandfarm.pid={owner}"]
    return {c["Id"] for c in client.api.containers(all=True, filters={"label": labels})}


NETWORK_PROBE = """
import socket
for host, port in {targets!r}:
    try:
        socket.create_connection((host, port), timeout=1).close()
        print("CONNECTED", host, port)
    except OSError as exc:
        print("refused", host, port, exc.errno)
print(open("/proc/net/dev").read())
"""


def test_no_network_at_all(docker_backend):
    """The target is a listener on the bridge gateway, which a container with a network
    reaches (127.0.0.1 in a container is the container's own: no probe there can fail)."""
    gateway = docker_bridge_gateway()
    with Listener(gateway) as listener:
        assert reachable_from_a_networked_container(gateway, listener.port)
        reached_before = listener.accepted()
        assert reached_before >= 1  # the control's connection arrived here
        targets = [(gateway, listener.port), ("10.0.0.1", 80)]
        result = _run(docker_backend, code=NETWORK_PROBE.format(targets=targets))
        reached_after = listener.accepted()
    out = result.steps[0].stdout if result.steps else ""
    assert result.status == Status.SUCCEEDED, result
    assert "CONNECTED" not in out, out
    assert out.count("refused") == len(targets), out  # every attempt ran, and failed
    assert reached_after == reached_before  # nothing of the job's arrived
    interfaces = [line.split(":")[0].strip() for line in out.splitlines() if ":" in line]
    assert "lo" in interfaces, out  # the interface table was read
    assert "eth0" not in interfaces


def test_writes_outside_the_workspace_fail(docker_backend):
    result = _run(
        docker_backend,
        command="for p in /etc/x /usr/x /x /home/x /var/x; do echo hi > $p && echo WROTE $p; done;"
        " echo ok > /workspace/in && echo ok > /tmp/in && echo INSIDE",
    )
    out = result.steps[0].stdout
    assert "INSIDE" in out, result  # the job ran and can write where it should
    assert "WROTE" not in out
    refusals = [line for line in result.steps[0].stderr.splitlines() if ": Read-only" in line]
    assert len(refusals) == 5, result  # every one of the five writes was tried, and refused


def test_job_is_not_root_and_has_no_capabilities(docker_backend):
    result = _run(docker_backend, command="id -u; grep -E '^Cap(Eff|Prm|Bnd)' /proc/self/status")
    lines = result.steps[0].stdout.split()
    assert len(lines) == 7, result  # the uid and three capability sets were read
    # a slot's uid in the Docker range, which no host backend's job shares
    assert d.DOCKER_UID_BASE <= int(lines[0]) < d.DOCKER_UID_BASE + d.MAX_SLOTS
    caps = dict(zip(lines[1::2], lines[2::2], strict=False))
    assert caps == {
        "CapPrm:": "0000000000000000",
        "CapEff:": "0000000000000000",
        "CapBnd:": "0000000000000000",
    }


def test_fork_bomb_is_stopped_by_the_pids_cap(docker_backend):
    result = _run(
        docker_backend,
        code="import os\nn = 0\ntry:\n    while True:\n        if os.fork() == 0:\n"
        "            import time; time.sleep(30)\n        n += 1\nexcept OSError:\n"
        "    print('capped at', n)\n",
        limits={"processes": 20, "timeout_s": 10},
    )
    out = result.steps[0].stdout
    assert "capped at" in out, result
    forks = int(out.split()[-1])
    # the job's uid holds exactly its cap: the bomb itself and 19 forks (nproc binds it)
    assert forks == 20 - 1, f"the bomb stopped at {forks} forks, not at its cap"


def test_timeout_leaves_no_container(docker_backend, client):
    docker_backend.close()  # earlier tests' containers finish their background removal
    before = managed_containers(client)
    seen: set[str] = set()
    box: dict = {}
    job = threading.Thread(
        target=lambda: box.setdefault(
            "r", _run(docker_backend, command="sleep 60", limits={"timeout_s": 2})
        )
    )
    job.start()
    while job.is_alive():
        seen |= managed_containers(client) - before
        time.sleep(0.05)
    job.join()
    assert seen, "the job never had a container of its own"
    assert box["r"].status == Status.TIMED_OUT, box["r"]
    docker_backend.close()  # waits for background removals
    assert managed_containers(client) <= before
    assert not seen & managed_containers(client)


def test_image_outside_the_allowlist_is_rejected(docker_backend):
    allowed = _run(docker_backend, image=d.DOCKER_IMAGE, command="echo ran")
    assert allowed.steps and allowed.steps[0].stdout == "ran\n", allowed  # naming works
    result = _run(docker_backend, image="debian:latest", command="true")
    assert result.status == Status.REJECTED
    assert "allowed images" in result.message


def test_200_mixed_jobs_leave_the_engine_as_found(docker_backend, client):
    docker_backend.close()  # earlier tests' containers finish their background removal
    before = managed_containers(client)
    kinds = [
        {"command": "echo ok"},
        {"command": "exit 1"},
        {"command": "sleep 30", "limits": {"timeout_s": 0.5}},
        {"command": "yes", "limits": {"flood_kill_bytes": 100_000}},
    ]
    statuses = set()
    for i in range(200):
        statuses.add(_run(docker_backend, **kinds[i % 4]).status)
    docker_backend.close()
    assert statuses == {Status.SUCCEEDED, Status.FAILED, Status.TIMED_OUT, Status.OUTPUT_FLOODED}
    assert managed_containers(client) == before


OWNER = """
from sandbox_core import parse_spec
from tests.security.conftest import make_backend
make_backend('docker').run(parse_spec({'command': 'sleep 120'}))
"""


def test_containers_of_a_killed_owner_are_reaped(docker_backend, client):
    owner = subprocess.Popen([sys.executable, "-c", OWNER], cwd=ROOT)  # fake or real, as we
    deadline = time.monotonic() + 30
    mine = []
    while not mine and time.monotonic() < deadline and owner.poll() is None:
        mine = list(managed_containers(client, owner.pid))
        time.sleep(0.2)
    assert mine, "the owner never started its container"
    os.kill(owner.pid, signal.SIGKILL)
    owner.wait()
    assert reap_orphans(client) >= 1
    left = client.api.containers(all=True, filters={"label": f"sandfarm.pid={owner.pid}"})
    assert left == []


def test_gvisor_runtime_runs_a_job():
    """The `runtime` setting reaches the engine: a job runs under gVisor's runsc."""
    ok, reason = docker_status("runsc")
    require(ok, reason)
    backend = make_backend("docker", runtime="runsc")
    try:
        result = _run(backend, code="print(open('/proc/version').read(), 'in-gvisor')")
        container_runtime = {p.name: p.detail for p in backend.protections()}["runtime"]
    finally:
        backend.close()
    assert result.status == Status.SUCCEEDED, result
    assert "in-gvisor" in result.steps[0].stdout
    host_kernel = Path("/proc/version").read_text().split()[2]
    assert host_kernel not in result.steps[0].stdout  # gVisor's own kernel, not the host's
    assert container_runtime.startswith("runsc")

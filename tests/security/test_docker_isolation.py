"""Docker-only promises: no network at all, read-only image, no root, no capabilities,
nothing left behind on the engine, and orphans of a dead owner reaped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from sandbox_core import Status, get_backend, parse_spec
from sandbox_core import defaults as d
from sandbox_core.backends.docker.containers import LABEL, reap_orphans
from tests.conftest import require
from tests.security.conftest import docker_status


@pytest.fixture(scope="module")
def docker_backend():
    ok, reason = docker_status()
    require(ok, reason)
    backend = get_backend("docker")
    yield backend
    backend.close()


def _run(backend, **spec):
    return backend.run(parse_spec(spec))


def managed_containers(client) -> set[str]:
    return {c["Id"] for c in client.api.containers(all=True, filters={"label": f"{LABEL}=1"})}


def test_no_network_at_all(docker_backend):
    code = textwrap.dedent(
        """
        import socket
        for host, port in [("127.0.0.1", 6379), ("172.17.0.1", 6379), ("10.0.0.1", 80)]:
            try:
                socket.create_connection((host, port), timeout=1)
                print("CONNECTED", host)
            except OSError as exc:
                print("refused", host, exc.errno)
        print(open("/proc/net/dev").read())
        """
    )
    result = _run(docker_backend, code=code)
    out = result.steps[0].stdout
    assert "CONNECTED" not in out, out
    interfaces = [line.split(":")[0].strip() for line in out.splitlines() if ":" in line]
    assert "eth0" not in interfaces


def test_writes_outside_the_workspace_fail(docker_backend):
    result = _run(
        docker_backend,
        command="for p in /etc/x /usr/x /x /home/x /var/x; do echo hi > $p && echo WROTE $p; done;"
        " echo ok > /workspace/in && echo ok > /tmp/in && echo INSIDE",
    )
    out = result.steps[0].stdout
    assert "WROTE" not in out
    assert "INSIDE" in out


def test_job_is_not_root_and_has_no_capabilities(docker_backend):
    result = _run(docker_backend, command="id -u; grep -E '^Cap(Eff|Prm|Bnd)' /proc/self/status")
    lines = result.steps[0].stdout.split()
    assert d.SLOT_UID_BASE <= int(lines[0]) < d.SLOT_UID_BASE + d.MAX_SLOTS  # a slot's uid
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
    assert int(out.split()[-1]) <= 20 + 4  # the cap leaves room for init, keeper, exec


def test_timeout_leaves_no_container(docker_backend):
    client = docker_backend.client
    before = managed_containers(client)
    result = _run(docker_backend, command="sleep 60", limits={"timeout_s": 1})
    assert result.status == Status.TIMED_OUT
    docker_backend.close()  # waits for background removals
    assert managed_containers(client) <= before


def test_image_outside_the_allowlist_is_rejected(docker_backend):
    result = _run(docker_backend, image="debian:latest", command="true")
    assert result.status == Status.REJECTED
    assert "allowed images" in result.message


def test_200_mixed_jobs_leave_the_engine_as_found(docker_backend):
    client = docker_backend.client
    before = len(client.api.containers(all=True))
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
    assert len(client.api.containers(all=True)) == before


def test_containers_of_a_killed_owner_are_reaped(docker_backend):
    client = docker_backend.client
    owner = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from sandbox_core import get_backend, parse_spec\n"
            "get_backend('docker').run(parse_spec({'command': 'sleep 120'}))",
        ],
    )
    deadline = time.monotonic() + 30
    mine = []
    while not mine and time.monotonic() < deadline:
        mine = [c for c in client.api.containers(filters={"label": f"sandfarm.pid={owner.pid}"})]
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
    backend = get_backend("docker", runtime="runsc")
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

"""Docker jobs with network (``limits.network``, with the operator's consent) are on the
farm's own bridge (sandbox_core/backends/docker/jobnetwork.py): they reach neither each
other nor the host. Each test first proves the attack works on Docker's default bridge.
"""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from sandbox_core import Backend, JobResult, Status, parse_spec
from sandbox_core.backends.docker import jobnetwork
from tests.conftest import require
from tests.security.conftest import docker_status, make_backend

# Serves one connection on port 8000 for up to 12 s; says whether anyone came.
SERVES = """
import socket
srv = socket.socket(); srv.bind(("0.0.0.0", 8000)); srv.listen(); srv.settimeout(12)
try:
    srv.accept(); print("accepted")
except OSError:
    print("nobody came")
"""
# Tries the peer's port 8000 and the host's port HOST_PORT at the bridge's gateway; says
# whether it has a default route (a network of its own) at all.
VISITS = """
import os, socket
for name, addr in (("peer", (os.environ["PEER"], 8000)),
                   ("host", (os.environ["GATEWAY"], int(os.environ["HOST_PORT"])))):
    try:
        socket.create_connection(addr, timeout=3).close(); print(name, "reached")
    except OSError as exc:
        print(name, "unreachable", type(exc).__name__)
routes = open("/proc/net/route").read().splitlines()[1:]
print("default route", any(line.split()[1] == "00000000" for line in routes))
print("ipv6 off", open("/proc/sys/net/ipv6/conf/all/disable_ipv6").read().strip())
"""


@pytest.fixture(scope="module")
def network_backend() -> Iterator[Backend]:
    ok, reason = docker_status("runc")
    require(ok, reason)
    backend = make_backend("docker", allow_network=True)
    yield backend
    backend.close()


@pytest.fixture
def host_listener() -> Iterator[tuple[int, list[str]]]:
    """A port on every host address, and who connected to it."""
    srv = socket.create_server(("0.0.0.0", 0))
    srv.settimeout(0.2)
    came: list[str] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, peer = srv.accept()
            except OSError:
                continue
            came.append(peer[0])
            conn.close()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield srv.getsockname()[1], came
    stop.set()
    thread.join(5)
    srv.close()


def _ip_on(container: Any, network: str) -> tuple[str, str]:
    """A running container's address on ``network``, and its gateway there."""
    for _ in range(100):
        container.reload()
        settings = container.attrs["NetworkSettings"]["Networks"].get(network) or {}
        if settings.get("IPAddress"):
            return settings["IPAddress"], settings["Gateway"]
        time.sleep(0.1)
    raise AssertionError(f"{container.name} has no address on {network}")


def _attack_on_dockers_default_bridge(network_backend: Any, port: int, came: list) -> None:
    """The attack works outside the farm: two plain containers on the default bridge
    reach each other and the host's listener."""
    client = network_backend.client
    image = network_backend.image
    server = client.containers.run(image, ["python3", "-c", SERVES], detach=True)
    try:
        peer, gateway = _ip_on(server, "bridge")
        env = {"PEER": peer, "GATEWAY": gateway, "HOST_PORT": str(port)}
        out = client.containers.run(image, ["python3", "-c", VISITS], environment=env, remove=True)
        assert out.decode().startswith("peer reached\nhost reached\ndefault route True\n")
        assert server.wait(timeout=30)["StatusCode"] == 0
        assert server.logs().decode() == "accepted\n"
        assert came, "the host's listener saw nobody"
    finally:
        server.remove(force=True)


def test_network_jobs_reach_neither_each_other_nor_the_host(network_backend, host_listener):
    port, came = host_listener
    _attack_on_dockers_default_bridge(network_backend, port, came)
    came.clear()
    served: list[JobResult] = []
    server_id = f"net-server-{uuid.uuid4().hex[:8]}"
    limits = {"network": True, "timeout_s": 30}
    spec = parse_spec({"id": server_id, "code": SERVES, "limits": limits})
    server_job = threading.Thread(target=lambda: served.append(network_backend.run(spec)))
    server_job.start()
    client = network_backend.client
    try:
        for _ in range(300):  # the server job's container, once it is made
            found = client.containers.list(filters={"label": f"sandfarm.job={server_id}"})
            if found:
                break
            time.sleep(0.1)
        assert found, "the server job's container never came"
        peer, gateway = _ip_on(found[0], jobnetwork.NAME)
        env = {"PEER": peer, "GATEWAY": gateway, "HOST_PORT": str(port)}
        visitor = network_backend.run(parse_spec({"code": VISITS, "env": env, "limits": limits}))
    finally:
        server_job.join(60)
    assert visitor.status == Status.SUCCEEDED, visitor
    lines = visitor.steps[0].stdout.splitlines()
    assert lines[2] == "default route True", lines  # a network job, with a network
    assert lines[0].startswith("peer unreachable"), lines
    assert lines[1].startswith("host unreachable"), lines
    assert lines[3] == "ipv6 off 1", lines  # the bridge's rules are IPv4's
    assert served and served[0].steps[0].stdout == "nobody came\n", served
    assert not came, came  # the host's listener saw nobody

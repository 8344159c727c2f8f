"""The job cannot see the worker's secrets or reach the broker."""

from __future__ import annotations

import os
from pathlib import Path

from sandbox_core import Status
from tests.conftest import redis_reachable, require
from tests.security.helpers import (
    NOBODY,
    Listener,
    backend_kind,
    connects,
    connects_as,
    docker_bridge_gateway,
    holder_process,
    new_marker,
    pid_alive,
    reachable_from_a_networked_container,
)

SECRET = "sandfarm-secret-7f3a9c"


def test_worker_environment_is_invisible(run, monkeypatch):
    # monkeypatch.setenv changes os.environ (what a careless spawn would pass on), never
    # /proc/self/environ: the secret a /proc probe could find lives in the holder below
    monkeypatch.setenv("SANDFARM_TEST_SECRET", SECRET)
    own = new_marker()
    with holder_process({"SANDFARM_TEST_SECRET": SECRET, "PATH": "/usr/bin:/bin"}) as holder:
        # positive control: the secret really is in a live root process's environment,
        # exactly where the worker's own secrets are
        assert (
            f"SANDFARM_TEST_SECRET={SECRET}".encode()
            in Path(f"/proc/{holder}/environ").read_bytes()
        )
        result = run(
            command=(
                # the probe works: the job reads the environment of a process it may read
                f"OWN={own} sleep 30 & child=$!; sleep 0.2; "
                "tr '\\0' '\\n' < /proc/$child/environ | grep '^OWN='; kill $child; "
                "env; cat /proc/$PPID/environ; "
                f"cat /proc/{holder}/environ; cat /proc/{os.getpid()}/environ; "
                "cat /proc/1/environ; n=0; "
                "for f in /proc/[0-9]*/environ; do n=$((n+1)); cat $f; done 2>/dev/null; "
                "echo; echo PROBED $n; true"
            )
        )
        assert pid_alive(holder)  # it was there to steal all through the job
    step = result.steps[0]
    assert f"OWN={own}" in step.stdout.splitlines(), result  # the probe reads environments
    assert any(line.startswith("PROBED ") for line in step.stdout.splitlines()), result
    assert SECRET not in step.stdout and SECRET not in step.stderr
    assert "SANDFARM_TEST_SECRET" not in step.stdout


def test_job_env_is_clean_but_has_its_own(run, monkeypatch):
    monkeypatch.setenv("SANDFARM_TEST_SECRET", SECRET)
    assert os.environ["SANDFARM_TEST_SECRET"] == SECRET  # the plant: the worker's own env
    result = run(command="env", env={"MY_VAR": "mine"})
    lines = set(result.steps[0].stdout.splitlines())
    assert "MY_VAR=mine" in lines, result  # the job's env was printed, its own var in it
    assert any(line.startswith("PATH=") for line in lines), result
    assert not any(line.startswith("SANDFARM_") for line in lines)
    assert SECRET not in result.steps[0].stdout


PROBE = """
import socket
for host, port in {targets!r}:
    try:
        socket.create_connection((host, port), timeout=2).close()
        print('CONNECTED', host, port)
    except OSError as exc:
        print('refused', host, port, exc.errno)
"""


def test_job_cannot_reach_the_broker(backend, run):
    """The broker stand-in is a listener where the job would reach it without the network
    defence: the host's loopback for the host backends, the bridge gateway for docker
    (127.0.0.1 in a container is the container's own)."""
    kind = backend_kind(backend)
    host = docker_bridge_gateway() if kind == "docker" else "127.0.0.1"
    with Listener(host) as listener:
        targets = [(host, listener.port)]
        if kind == "docker":
            assert reachable_from_a_networked_container(host, listener.port)
        else:
            assert connects_as(NOBODY, host, listener.port)  # any unconfined host process
            require(redis_reachable(), "no Redis on 127.0.0.1:6379 to attack")
            assert connects("127.0.0.1", 6379)
            targets.append(("127.0.0.1", 6379))
        reached_before = listener.accepted()
        assert reached_before >= 1  # the control's connection arrived
        result = run(code=PROBE.format(targets=targets))
        reached_after = listener.accepted()
    out = result.steps[0].stdout if result.steps else ""
    assert result.status == Status.SUCCEEDED, result
    assert "CONNECTED" not in out, out
    assert out.count("refused") == len(targets), out  # every attempt ran and failed
    assert reached_after == reached_before  # nothing from the job arrived


def test_network_flag_allows_loopback_inside_job(run):
    code = (
        "import socket\n"
        "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
        "c = socket.create_connection(s.getsockname()); print('loopback ok')\n"
    )
    result = run(code=code)
    assert result.steps[0].stdout == "loopback ok\n", result

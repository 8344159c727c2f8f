"""Docker-only holes of the second review: shared uids across jobs, leftovers that
outlive their step, containers that outlive `sandfarm run`, and a reaper that judged
owners by pids of its own namespace."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from sandbox_core import get_backend, parse_spec
from sandbox_core.backends.docker.containers import LABEL, Owner, reap_orphans
from tests.conftest import require
from tests.security.conftest import docker_status
from tests.security.helpers import new_marker, pids_with_marker, wait_gone

SANDFARM = str(Path(sys.executable).parent / "sandfarm")


@pytest.fixture(scope="module")
def docker_backend():
    ok, reason = docker_status()
    require(ok, reason)
    backend = get_backend("docker")
    yield backend
    backend.close()


def _client():
    import docker

    return docker.from_env(timeout=30)


# Stops every tar the job's uid runs (the farm's file helper is a tar in the container).
STOPPER = (
    "setsid sh -c 'while :; do for p in /proc/[0-9]*; do"
    ' [ "$(cat $p/comm 2>/dev/null)" = tar ] && kill -STOP ${{p#/proc/}};'
    " done; done; : {marker}' >/dev/null 2>&1 &"
)


def test_a_leftover_cannot_hold_the_sandbox_past_the_deadline(docker_backend):
    marker = new_marker()
    seen: list[int] = []
    done: dict = {}
    spec = {
        "steps": [
            {"kind": "bash", "command": STOPPER.format(marker=marker) + " sleep 0.5; echo started"},
            {"kind": "write_file", "path": "a.txt", "content": "after"},
            {"kind": "bash", "command": "cat a.txt"},
        ],
        "limits": {"timeout_s": 3},
    }
    started = time.monotonic()
    thread = threading.Thread(target=lambda: done.update(r=docker_backend.run(parse_spec(spec))))
    thread.start()
    while thread.is_alive():
        seen = seen or pids_with_marker(marker)  # the stopper, seen from the host
        time.sleep(0.02)
    elapsed = time.monotonic() - started
    result = done["r"]
    assert seen, "the stopper never ran"
    assert result.steps[0].stdout == "started\n", result
    assert elapsed < 3 + 10, elapsed  # never the old 60 s helper deadline
    assert result.steps[1].status == "succeeded", result  # swept before the file step
    assert result.steps[2].stdout == "after", result
    assert wait_gone(marker) == []


DAEMONS = """
import os, subprocess, sys, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execvp("python3", ["python3", "-c", "import time; time.sleep(300)", "{marker}"])
    os._exit(0)
subprocess.Popen(["setsid", "-f", "python3", "-c", "import time; time.sleep(300)", "{marker}"])
time.sleep(0.5)
print("started", flush=True)
"""


@pytest.mark.no_backend  # runs the real CLI in a subprocess; its own controls below
def test_sandfarm_run_leaves_no_container_or_process(is_root):
    ok, reason = docker_status()
    require(ok, reason)
    marker = new_marker()
    seen: list[int] = []
    proc = subprocess.Popen(
        [SANDFARM, "run", "--backend", "docker", "--json", "--code", DAEMONS.format(marker=marker)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 30
    while proc.poll() is None and time.monotonic() < deadline:
        seen = seen or pids_with_marker(marker)  # seen from the host's pid namespace
        time.sleep(0.05)
    out, err = proc.communicate(timeout=60)
    result = json.loads(out)
    assert result["steps"][0]["stdout"] == "started\n", (result, err)
    assert len(seen) >= 1, "the daemons never started"  # the attack ran
    assert wait_gone(marker, timeout_s=0.5) == []  # ...and nothing of it outlives the CLI
    owned = _client().api.containers(
        all=True, filters={"label": [f"{LABEL}=1", f"sandfarm.pid={proc.pid}"]}
    )
    assert owned == []


UNSHARED_REAPER = """
import sys
from sandbox_core.backends.docker.containers import reap_orphans
import docker
print("removed", reap_orphans(docker.from_env()))
"""


@pytest.mark.no_backend  # creates its containers by hand; its own controls below
def test_a_reaper_in_another_pid_namespace_spares_live_owners(is_root):
    ok, reason = docker_status()
    require(ok, reason)
    require(is_root, "unshare --pid needs root")
    client = _client()
    mine = Owner.this_process("test-owner").labels()
    alive = client.containers.run(
        "sandfarm/sandbox:latest", ["sleep", "300"], detach=True, labels=mine
    ).id
    dead_labels = {**mine, "sandfarm.pid": "999999999", "sandfarm.start": "1"}
    dead = client.containers.run(
        "sandfarm/sandbox:latest", ["sleep", "300"], detach=True, labels=dead_labels
    ).id
    try:
        # A reaper inside a fresh pid namespace (a worker in a container) sees neither
        # owner's pid: it must leave both alone.
        out = subprocess.run(
            ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", UNSHARED_REAPER],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=Path(__file__).resolve().parents[2],
        )
        assert out.stdout.strip() == "removed 0", out
        running = {c.id for c in client.containers.list(filters={"label": f"{LABEL}=1"})}
        assert {alive, dead} <= running
        # Control: a reaper in our namespace can judge, and removes only the dead one.
        assert reap_orphans(client) >= 1
        running = {c.id for c in client.containers.list(filters={"label": f"{LABEL}=1"})}
        assert alive in running and dead not in running
    finally:
        for container in (alive, dead):
            with contextlib.suppress(Exception):  # already gone
                client.api.remove_container(container, force=True)


MAKES_DEVPTS_AND_DIES = """
import os, sys
from pathlib import Path
from sandbox_core.backends.docker.containers import _devpts
print(_devpts(Path(sys.argv[1]), 16), flush=True)
os._exit(0)  # dies before its container would have named it (a label)
"""


@pytest.mark.no_backend  # mounts devpts instances by hand; its own control below
def test_a_devpts_whose_maker_died_before_its_container_is_unmounted(is_root, tmp_path):
    """A container's devpts instance is mounted on the host before the container is made,
    and only the container's label names it: a worker killed in between left the mount
    for ever (an attack review). The reaper unmounts one whose maker is dead and that
    no container names, and never one whose maker lives."""
    from sandbox_core.backends.docker.containers import _devpts, _remove_devpts
    from sandbox_core.childsetup import mount_devpts

    ok, reason = docker_status()
    require(ok, reason)
    require(is_root, "mounting devpts needs root")
    base = tmp_path / "docker-pts"
    made = subprocess.run(
        [sys.executable, "-c", MAKES_DEVPTS_AND_DIES, str(base)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
    )
    orphan = Path(made.stdout.strip())
    live = _devpts(base, 16)  # the control: its maker (this process) is alive
    assert live is not None
    # ... and one whose maker's pid means nothing here (another pid namespace's)
    foreign = base / orphan.name.replace("pts-", "pts-1", 1)
    foreign.mkdir()
    mount_devpts(str(foreign), 16)
    try:
        assert orphan.parent == base and os.path.ismount(orphan), made  # left mounted
        reap_orphans(_client(), pts_dir=base)
        assert not os.path.ismount(orphan) and not orphan.exists()
        assert os.path.ismount(live)  # the live maker's is left alone
        assert os.path.ismount(foreign)  # and the one it cannot judge (a review found it)
    finally:
        for path in (live, orphan, foreign):
            if os.path.ismount(path):
                _remove_devpts(path)


def _execs_of_job(client, job_id: str) -> tuple[str, list[dict]]:
    """(container, its running execs' configs) of job ``job_id``'s container (a cold
    one: labelled with its job). The engine lists an exec there while it runs only, and
    keeps its config for minutes after (its exec store's sweep)."""
    for container in client.api.containers(filters={"label": f"sandfarm.job={job_id}"}):
        info = client.api.inspect_container(container["Id"])
        return container["Id"], [client.api.exec_inspect(e) for e in info.get("ExecIDs") or []]
    return "", []


def test_a_steps_exec_hands_the_engine_little_whatever_the_job_carries(docker_backend):
    """dockerd keeps every exec's argv and environment for minutes after it ends (its
    exec store is swept every 5 minutes, container gone or not): a job of 128 steps
    with 4 MiB of env held ~1 GB of the engine's memory, outside every bound (an attack
    review). The env is bounded (64 KiB in all), and a step whose program and env come
    to more than 8 KiB starts through a launcher that reads them over its stream."""
    client = _client()
    marker = new_marker()
    env = {f"V{i}": chr(65 + i) * 15000 for i in range(4)}  # 60 KiB: under the bound
    code = (
        "import hashlib, os, time\ntime.sleep(1)\n"
        "print(hashlib.sha256(''.join(os.environ[f'V{i}'] for i in range(4)).encode())"
        ".hexdigest())\n# " + "x" * 20000 + "\n"
    )
    spec = {
        "steps": [
            {"kind": "python", "code": code},
            {"kind": "python", "code": code},
            {"kind": "bash", "command": "sleep 3"},
        ],
        "id": marker,
        "env": env,
        "limits": {"timeout_s": 30},
    }
    done: dict = {}
    runner = threading.Thread(target=lambda: done.update(r=docker_backend.run(parse_spec(spec))))
    runner.start()
    seen: dict[str, dict] = {}
    probed = 0
    deadline = time.monotonic() + 25
    while time.monotonic() < deadline and runner.is_alive():
        container, running = _execs_of_job(client, marker)
        seen.update((x["ID"], x) for x in running)
        if container and not probed:  # the engine shows what an exec carries: a plain one
            probe = client.api.exec_create(container, ["true", code])["Id"]
            probed = len(client.api.exec_inspect(probe)["ProcessConfig"]["arguments"][0])
            seen.pop(probe, None)
        time.sleep(0.05)
    runner.join(40)
    execs = [x for x in seen.values() if "true" not in x["ProcessConfig"]["entrypoint"]]
    result = done["r"]
    want = hashlib.sha256("".join(env[f"V{i}"] for i in range(4)).encode()).hexdigest()
    assert [s.stdout.strip() for s in result.steps[:2]] == [want, want], result  # it ran
    assert len(execs) >= 3, execs  # each step's exec, seen while the job ran
    carried = [len(" ".join(x["ProcessConfig"]["arguments"]).encode()) for x in execs]
    assert probed > 20000  # the control: a plain exec's config holds the program whole
    assert max(carried) < 8 * 1024, carried  # the steps' execs: not their 20 KB programs

"""What the bwrap backend adds over the process sandbox: the job sees only its own
processes and a minimal read-only filesystem, and has no network. Every test checks
on the host too that the attack changed nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

import sandbox_core
from sandbox_core import JobResult, Status, get_backend, parse_spec, slots
from sandbox_core.backends import bwrap
from sandbox_core.backends.base import Backend
from tests.conftest import redis_reachable, require
from tests.security.helpers import new_marker, pids_with_marker, wait_gone

SOURCE_TREE = Path(sandbox_core.__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def backend() -> Backend:
    found = bwrap.probe()
    require(found.ok, found.detail)
    return get_backend("bwrap")


def init_name(backend: Backend) -> str:
    """The pid 1 a bwrap job runs under: our init, tini, or bwrap's own."""
    assert isinstance(backend, bwrap.BwrapBackend)
    if backend.own_init:
        return "init"
    return "tini" if bwrap.probe().as_pid_1 and bwrap.host.tini() else "bwrap"


def run(backend: Backend, **spec: object) -> JobResult:
    return backend.run(parse_spec(spec))


def test_job_sees_only_its_own_processes(backend):
    host = subprocess.Popen(["sleep", "60"])  # a host process the job must not see
    try:
        code = (
            "import json, os\n"
            "pids = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())\n"
            "cmds = [open(f'/proc/{p}/cmdline', 'rb').read().decode(errors='replace')"
            " for p in pids]\n"
            f"try:\n    os.kill({host.pid}, 0)\n    reach = True\n"
            "except OSError:\n    reach = False\n"
            "print(json.dumps({'pids': pids, 'cmds': cmds, 'reach': reach}))\n"
        )
        result = run(backend, code=code)
        assert result.status == Status.SUCCEEDED, result
        seen = json.loads(result.steps[0].stdout)
        # bwrap's init (pid 1) and the python step (pid 2): nothing of the host
        assert seen["pids"] == [1, 2], seen
        assert not any("pytest" in cmd or "sleep" in cmd for cmd in seen["cmds"]), seen
        assert seen["reach"] is False  # the host pid does not exist in the job's namespace
        assert host.poll() is None  # and the host process is untouched
    finally:
        host.kill()
        host.wait()


def test_ps_lists_only_the_job(backend):
    result = run(backend, command="sleep 5 & ps -e -o pid=,comm=; kill %1")
    assert result.status == Status.SUCCEEDED, result
    names = [line.split()[1] for line in result.steps[0].stdout.splitlines()]
    assert sorted(names) == sorted([init_name(backend), "bash", "ps", "sleep"]), names


def _host_processes_of(uid: int) -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            status = (entry / "status").read_text() if entry.name.isdigit() else ""
        except OSError:
            continue
        fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
        if fields.get("Uid", "").split("\t")[0] == str(uid):
            found.append(f"{entry.name} {fields['Name']} {fields['State']}")
    return found


def test_steps_leave_no_process_or_zombie_behind(backend, is_root):
    require(is_root, "slot uids need root")
    result = run(
        backend,
        steps=[
            {"kind": "bash", "command": "id -u"},
            {"kind": "bash", "command": "sleep 30 & setsid sleep 30 & echo spawned"},
            {"kind": "bash", "command": "kill -SEGV $$"},
            {"kind": "python", "code": "print('last')"},
        ],
        stop_on_error=False,
    )
    assert [s.status for s in result.steps] == ["succeeded", "succeeded", "crashed", "succeeded"]
    uid = int(result.steps[0].stdout)
    # bwrap's own init would linger as a zombie until the host's init reaps it (counted
    # against the slot's process limit); under tini nothing of the slot is left at all
    leftovers = _host_processes_of(uid)
    if bwrap.probe().as_pid_1:
        assert leftovers == [], leftovers
    else:
        assert all("zombie" in p for p in leftovers), leftovers


def test_host_secrets_and_worker_files_are_invisible(backend, tmp_path):
    host_tmp_file = tmp_path / "worker-secret.txt"  # under the host's /tmp
    host_tmp_file.write_text("secret")
    paths = [
        "/etc/shadow",
        "/etc/gshadow",
        "/etc/sudoers",
        "/root",
        "/home",
        "/run",
        "/var/run",
        "/sys",
        str(SOURCE_TREE),
        str(Path(sandbox_core.__file__).resolve()),
        sys.executable,  # the worker's virtualenv
        str(host_tmp_file),
        str(slots.state_dir()),  # slot locks and every job's workspace
    ]
    script = "".join(f"test -e {p} && echo VISIBLE {p}\n" for p in paths)
    result = run(backend, command=script + "cat /etc/passwd; ls /tmp /workspace")
    assert result.status == Status.SUCCEEDED, result
    out = result.steps[0].stdout
    assert "VISIBLE" not in out, out
    assert "secret" not in out and "worker-secret" not in out
    # only the sandbox's own users, none of the host's accounts
    users = {line.split(":")[0] for line in out.splitlines() if line.count(":") >= 6}
    assert users == {"root", "sandbox", "nobody"}, out


def test_another_jobs_workspace_is_invisible(backend):
    marker = new_marker()
    other: dict = {}

    def long_job() -> None:
        other["result"] = get_backend("bwrap").run(
            parse_spec({"command": f"echo {marker} > {marker}.txt; sleep 3"})
        )

    thread = threading.Thread(target=long_job)
    thread.start()
    try:
        time.sleep(1)
        workspaces = sorted(slots.workspace_base().glob("slot-*/job-*/work"))
        assert workspaces, "the other job never started"
        probes = "".join(f"ls {w} 2>/dev/null && echo LISTED\n" for w in workspaces)
        places = "/tmp /workspace /dev/shm /.sandfarm /etc /var"
        result = run(backend, command=probes + f"find {places} -name '{marker}.*'; true")
    finally:
        thread.join(timeout=30)
    assert result.status == Status.SUCCEEDED, result
    assert "LISTED" not in result.steps[0].stdout
    assert marker not in result.steps[0].stdout
    assert other["result"].status == Status.SUCCEEDED, other["result"]


def test_writes_outside_workspace_and_tmp_fail(backend):
    name = f"sandfarm-escape-{uuid.uuid4().hex[:8]}"
    targets = ["/", "/etc", "/usr", "/usr/local/bin", "/var", "/dev", "/.sandfarm/scripts"]
    script = "".join(
        f"(echo x > {d}/{name}) 2>/dev/null && echo WROTE {d}\n"
        f"mkdir {d}/{name}.d 2>/dev/null && echo MADE {d}\n"
        for d in targets
    )
    script += f"echo ok > /workspace/{name} && echo ok > /tmp/{name} && echo controls-ok\n"
    result = run(backend, command=script, collect=[name])
    assert result.status == Status.SUCCEEDED, result
    out = result.steps[0].stdout
    assert "WROTE" not in out and "MADE" not in out, out
    assert "controls-ok" in out  # the workspace and /tmp are writable
    assert [f.path for f in result.files] == [name]
    for directory in [*targets, "/tmp", "/var/tmp", "/workspace"]:  # nothing reached the host
        assert not os.path.exists(f"{directory}/{name}")
        assert not os.path.exists(f"{directory}/{name}.d")


def test_remounting_or_new_namespaces_fail(backend):
    result = run(
        backend,
        command=(
            "mount -o remount,rw / 2>/dev/null && echo REMOUNTED\n"
            "mount -t tmpfs none /workspace 2>/dev/null && echo MOUNTED\n"
            "unshare -Ur true 2>/dev/null && echo USERNS\n"
            "echo done\n"
        ),
    )
    assert result.status == Status.SUCCEEDED, result
    out = result.steps[0].stdout
    assert "REMOUNTED" not in out and "MOUNTED" not in out, out
    if bwrap.probe().disable_userns:
        assert "USERNS" not in out, out
    assert out.endswith("done\n")


def test_no_network_redis_unreachable(backend):
    require(redis_reachable(), "no Redis on 127.0.0.1:6379 to attack")
    code = (
        "import socket\n"
        "for addr in [('127.0.0.1', 6379), ('1.1.1.1', 53)]:\n"
        "    try:\n"
        "        socket.create_connection(addr, timeout=2).close()\n"
        "        print('CONNECTED', addr)\n"
        "    except OSError as exc:\n"
        "        print('refused', addr, exc.errno)\n"
        "print(sorted(name for _, name in socket.if_nameindex()))\n"
    )
    result = run(backend, code=code)
    assert result.status == Status.SUCCEEDED, result
    out = result.steps[0].stdout
    assert "CONNECTED" not in out, out
    assert out.count("refused") == 2
    assert out.splitlines()[-1] == "['lo']"  # loopback only, no host interface


def test_network_flag_shares_the_host_network(backend):
    require(redis_reachable(), "no Redis on 127.0.0.1:6379")
    code = "import socket\nsocket.create_connection(('127.0.0.1', 6379), timeout=2)\nprint('ok')\n"
    allowed = get_backend("bwrap", allow_network=True)  # the operator's opt-in
    try:
        result = run(allowed, code=code, limits={"network": True})
    finally:
        allowed.close()
    assert result.steps[0].stdout == "ok\n", result
    assert run(backend, code=code, limits={"network": True}).status == Status.REJECTED


def test_signal_deaths_are_reported_as_signals(backend):
    result = run(
        backend,
        steps=[
            {"kind": "bash", "command": "kill -SEGV $$"},
            {"kind": "python", "code": "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"},
            {"kind": "bash", "command": "exit 3"},
        ],
        stop_on_error=False,
    )
    segv, kill, exit3 = result.steps
    assert (segv.status, segv.signal, segv.exit_code) == ("crashed", 11, None), segv
    assert (kill.status, kill.signal) == ("crashed", 9), kill
    assert (exit3.status, exit3.exit_code, exit3.signal) == ("failed", 3, None), exit3


def test_process_limit_counts_the_job_not_bwrap(backend):
    # processes=4: bash plus three children fit; bwrap's own two processes come on top
    fits = run(
        backend, command="sleep 1 & sleep 1 & sleep 1 & wait; echo fits", limits={"processes": 4}
    )
    assert fits.status == Status.SUCCEEDED, fits
    assert fits.steps[0].stdout == "fits\n", fits
    bomb = run(
        backend,
        command="for i in $(seq 20); do sleep 2 & done 2>&1; wait",
        limits={"processes": 4, "timeout_s": 10},
    )
    assert "Resource temporarily unavailable" in bomb.steps[0].stdout + bomb.steps[0].stderr


def test_daemon_dies_with_the_step(backend):
    marker = new_marker()
    result = run(
        backend,
        command=f"setsid -f python3 -c 'import time; time.sleep(60)' {marker}; echo started",
    )
    assert result.status == Status.SUCCEEDED, result
    assert wait_gone(marker, timeout_s=0.5) == []
    assert pids_with_marker(marker) == []


def test_protections_are_reported():
    backend = get_backend("bwrap")
    found = bwrap.probe()
    names = {p.name: p for p in backend.protections()}
    for name in ("tree_kill", "uid_isolation", "network_isolation", "pid_namespace"):
        assert name in names
    assert "filesystem_isolation" in names
    assert names["pid_namespace"].active is found.ok
    assert names["filesystem_isolation"].active is found.ok


def test_missing_bwrap_rejects_jobs_even_when_weaker_is_allowed(monkeypatch):
    missing = bwrap.Probe(None, False, "bwrap not found on PATH")
    monkeypatch.setattr(bwrap.backend, "probe", lambda: missing)
    for allow_weaker in (False, True):
        backend = get_backend("bwrap", allow_weaker=allow_weaker)
        result = backend.run(parse_spec({"command": "echo should-not-run"}))
        assert result.status == Status.REJECTED, result
        assert "bwrap not found" in (result.message or "")
        assert result.steps == []
    protections = {p.name: p for p in get_backend("bwrap").protections()}
    assert not protections["network_isolation"].active
    assert protections["pid_namespace"].detail == "bwrap not found on PATH"


def test_unusable_bwrap_is_reported_with_the_reason(monkeypatch):
    monkeypatch.setattr(bwrap.host.shutil, "which", lambda name, path=None: "/bin/false")
    bwrap.probe.cache_clear()
    try:
        found = bwrap.probe()
        assert not found.ok
        assert "cannot build its namespaces" in found.detail
        result = get_backend("bwrap").run(parse_spec({"command": "echo no"}))
        assert result.status == Status.REJECTED, result
    finally:
        bwrap.probe.cache_clear()

"""What the bwrap backend adds over the process sandbox: the job sees only its own
processes and a minimal read-only filesystem, and has no network. Every test checks
on the host too that the attack changed nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest

import sandbox_core
from sandbox_core import JobResult, Status, get_backend, parse_spec, slots
from sandbox_core.backends import bwrap, prewarm
from sandbox_core.backends.base import Backend
from tests.conftest import redis_reachable, require
from tests.security.conftest import bwrap_status, make_backend
from tests.security.helpers import (
    NOBODY,
    Listener,
    connects,
    connects_as,
    host_processes_of,
    new_marker,
    pid_alive,
    pids_with_marker,
    run_watching,
    wait_gone,
    wait_until,
)

SOURCE_TREE = Path(sandbox_core.__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def backend() -> Backend:
    ok, reason = bwrap_status()
    require(ok, reason)
    return make_backend("bwrap")


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
            "os.kill(os.getpid(), 0)\n"  # the probe's own control: signal 0 works on itself
            "print(json.dumps({'pids': pids, 'cmds': cmds, 'reach': reach,"
            " 'me': os.getpid()}))\n"
        )
        assert pid_alive(host.pid)  # the host process is there to be seen
        result = run(backend, code=code)
        assert result.status == Status.SUCCEEDED, result
        seen = json.loads(result.steps[0].stdout)
        assert seen["me"] in seen["pids"]  # the listing shows what exists
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


def test_steps_leave_no_process_or_zombie_behind(backend, is_root):
    require(is_root, "slot uids need root")
    marker = new_marker()
    spawn = (
        f"(exec -a {marker} sleep 30) & setsid bash -c 'exec -a {marker} sleep 30' &"
        " sleep 0.3; echo spawned"
    )
    result, watched = run_watching(
        lambda: run(
            backend,
            steps=[
                {"kind": "bash", "command": "id -u"},
                {"kind": "bash", "command": spawn},
                {"kind": "bash", "command": "kill -SEGV $$"},
                {"kind": "python", "code": "print('last')"},
            ],
            stop_on_error=False,
        ),
        marker,
    )
    assert [s.status for s in result.steps] == ["succeeded", "succeeded", "crashed", "succeeded"]
    assert len(watched.pids) == 2, watched  # both sleepers were alive on the host
    uid = int(result.steps[0].stdout)
    assert watched.uids == {uid}
    assert not watched.pids & set(pids_with_marker(marker))  # (pids get reused: by marker)
    # bwrap's own init would linger as a zombie until the host's init reaps it (counted
    # against the slot's process limit); under tini nothing of the slot is left at all
    leftovers = host_processes_of(uid)
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
    # the probe looks for what is there on the host, to be hidden (a path missing on the
    # host, like /etc/sudoers without sudo, proves nothing); the worker's own always are
    paths = [p for p in paths if os.path.exists(p)]
    assert set(paths) >= {"/etc/shadow", str(SOURCE_TREE), sys.executable, str(host_tmp_file)}
    script = "".join(f"test -e {p} && echo VISIBLE {p}\n" for p in paths)
    script += "test -e /workspace && echo CONTROL-SEEN\n"  # the probe sees what exists
    result = run(backend, command=script + "cat /etc/passwd; ls /tmp /workspace")
    assert result.status == Status.SUCCEEDED, result
    out = result.steps[0].stdout
    assert "CONTROL-SEEN" in out, result
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

    def planted() -> list[Path]:  # the other job's file, as the host sees it
        return sorted(slots.workspace_base().glob(f"slot-*/job-*/work/{marker}.txt"))

    thread = threading.Thread(target=long_job)
    thread.start()
    try:
        found = wait_until(planted, thread, timeout_s=10)
        assert found, "the other job never started"
        assert found[0].read_text() == f"{marker}\n"  # the plant is there to be found
        workspaces = sorted(slots.workspace_base().glob("slot-*/job-*/work"))
        probes = "".join(f"ls {w} 2>/dev/null && echo LISTED\n" for w in workspaces)
        places = "/tmp /workspace /dev/shm /.sandfarm /etc /var"
        own = new_marker()  # the spy's control: find finds a file where one is
        result = run(
            backend,
            command=probes + f"touch /tmp/{own}.txt; find {places} -name '{marker}.*' "
            f"-o -name '{own}.*'; true",
        )
        assert thread.is_alive() and found[0].exists()  # still there all through the spy
    finally:
        thread.join(timeout=30)
    assert result.status == Status.SUCCEEDED, result
    assert f"/tmp/{own}.txt" in result.steps[0].stdout, result
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
            "command -v mount unshare\n"  # the tools are there: their failure is the sandbox's
            "mount -o remount,rw / 2>/dev/null && echo REMOUNTED\n"
            "mount -t tmpfs none /workspace 2>/dev/null && echo MOUNTED\n"
            "unshare -Ur true 2>/dev/null && echo USERNS\n"
            "echo done\n"
        ),
    )
    assert result.status == Status.SUCCEEDED, result
    out = result.steps[0].stdout
    assert out.startswith("/usr/bin/mount\n/usr/bin/unshare\n"), out
    assert "REMOUNTED" not in out and "MOUNTED" not in out, out
    if bwrap.probe().disable_userns:
        assert "USERNS" not in out, out
    assert out.endswith("done\n")


def test_no_network_redis_unreachable(backend):
    require(redis_reachable(), "no Redis on 127.0.0.1:6379 to attack")
    assert connects("127.0.0.1", 6379)  # the broker answers on the host's loopback
    with Listener("127.0.0.1") as listener:
        assert connects_as(NOBODY, "127.0.0.1", listener.port)  # any host process gets in
        reached_before = listener.accepted()
        targets = [("127.0.0.1", 6379), ("127.0.0.1", listener.port), ("1.1.1.1", 53)]
        code = (
            "import socket\n"
            f"for addr in {targets!r}:\n"
            "    try:\n"
            "        socket.create_connection(addr, timeout=2).close()\n"
            "        print('CONNECTED', addr)\n"
            "    except OSError as exc:\n"
            "        print('refused', addr, exc.errno)\n"
            "net = open('/proc/net/dev').readlines()[2:]  # the job's namespace's interfaces\n"
            "print(sorted(line.split(':')[0].strip() for line in net))\n"
        )
        result = run(backend, code=code)
        reached_after = listener.accepted()
    assert result.status == Status.SUCCEEDED, result
    out = result.steps[0].stdout
    assert "CONNECTED" not in out, out
    assert out.count("refused") == len(targets), out  # every attempt ran, and failed
    assert reached_after == reached_before == 1  # only the control's connection came
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
    # as a number: the job itself and exactly three children, never a fifth process
    counted = run(
        backend,
        code="import os, time\nn = 0\nfor _ in range(20):\n    try:\n"
        "        pid = os.fork()\n    except OSError:\n        continue\n"
        "    if pid == 0:\n        time.sleep(2)\n        os._exit(0)\n"
        "    n += 1\nprint('forked', n)\n",
        limits={"processes": 4, "timeout_s": 10},
    )
    assert counted.steps and counted.steps[0].stdout == "forked 3\n", counted


def test_daemon_dies_with_the_step(backend):
    marker = new_marker()
    daemon = 'import time; open("started", "w").write("up"); time.sleep(60)'
    command = (
        f"setsid -f python3 -c '{daemon}' {marker}; "
        "for i in $(seq 200); do [ -s started ] && break; sleep 0.02; done; "
        "cat started; sleep 0.3"
    )
    result, watched = run_watching(lambda: run(backend, command=command), marker)
    assert result.status == Status.SUCCEEDED, result
    assert result.steps[0].stdout == "up", result  # the daemon started, in the job
    assert watched.pids, "the daemon was never alive on the host"
    assert wait_gone(marker, timeout_s=0.5) == []
    assert pids_with_marker(marker) == []


def test_protections_are_reported():
    """What the backend reports is what a job gets: each protection it reports active is
    checked on a job."""
    backend = get_backend("bwrap")
    found = bwrap.probe()
    names = {p.name: p for p in backend.protections()}
    for name in ("tree_kill", "uid_isolation", "network_isolation", "pid_namespace"):
        assert name in names
    assert "filesystem_isolation" in names
    assert names["pid_namespace"].active is found.ok
    assert names["filesystem_isolation"].active is found.ok
    require(found.ok, found.detail)
    probe = (
        "import os, socket\n"
        "print('pids', len([p for p in os.listdir('/proc') if p.isdigit()]))\n"
        "print('uid', os.getuid())\n"
        "net = [line.split(':')[0].strip() for line in open('/proc/net/dev').readlines()[2:]]\n"
        "print('ifaces', ','.join(sorted(net)))\n"
        "print('home', os.path.exists('/home'), os.path.exists('/etc/shadow'))\n"
    )
    result = backend.run(parse_spec({"code": probe}))
    backend.close()
    seen = dict(line.split(" ", 1) for line in result.steps[0].stdout.splitlines())
    assert seen["pids"] == "2", result  # pid_namespace: its init and the probe, nothing else
    assert seen["uid"] != "0"  # uid_isolation
    assert seen["ifaces"] == "lo"  # network_isolation
    assert seen["home"] == "False False"  # filesystem_isolation


def test_missing_bwrap_rejects_jobs_even_when_weaker_is_allowed(monkeypatch):
    # positive control: with bwrap there, the same job runs
    control = get_backend("bwrap").run(parse_spec({"command": "echo should-run"}))
    assert control.steps and control.steps[0].stdout == "should-run\n", control
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
    # positive control: the real bwrap runs the job
    control = get_backend("bwrap").run(parse_spec({"command": "echo yes"}))
    assert control.steps and control.steps[0].stdout == "yes\n", control
    prewarm.settle()  # the standby made after it must not probe the broken bwrap below
    monkeypatch.setattr(bwrap.host.shutil, "which", lambda name, path=None: "/bin/false")
    bwrap.probe.cache_clear()
    try:
        found = bwrap.probe()
        assert not found.ok
        assert "cannot build its namespaces" in found.detail
        result = get_backend("bwrap").run(parse_spec({"command": "echo no"}))
        assert result.status == Status.REJECTED, result
        assert "cannot build its namespaces" in (result.message or ""), result
        assert result.steps == []
    finally:
        bwrap.probe.cache_clear()

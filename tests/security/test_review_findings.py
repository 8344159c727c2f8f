"""Attacks from the independent security review, each proved to fail on every backend."""

from __future__ import annotations

import base64
import contextlib
import errno
import os
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from sandbox_core import Status, parse_spec
from sandbox_core.sweep import pids_of_uid, sweep_uid
from tests.conftest import require
from tests.security.helpers import NOBODY, wait_until

# Every process that loads it logs its euid to $HOME/preload.log (HOME is the job's
# workspace: a root process started with the job's environment logs there too), and a
# root one also writes MARKER (a path on the host).
PRELOAD_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
__attribute__((constructor)) static void pwn(void) {
    const char *home = getenv("HOME");
    if (home) {
        char path[4096];
        snprintf(path, sizeof path, "%s/preload.log", home);
        FILE *f = fopen(path, "a");
        if (f) { fprintf(f, "euid=%d\n", (int)geteuid()); fclose(f); }
    }
    if (geteuid() == 0) {
        FILE *f = fopen("MARKER", "w");
        if (f) { fputs("written as uid 0\n", f); fclose(f); }
    }
}
"""


def test_ld_preload_never_reaches_a_root_process(run, tmp_path):
    """The job's env must only ever apply after the privilege drop (the exec helper and
    bwrap start as root / outside the sandbox)."""
    require(shutil.which("cc") is not None, "no C compiler to build the attack library")
    marker = f"/root/sandfarm-pwned-{uuid.uuid4().hex[:8]}"
    source = tmp_path / "evil.c"
    source.write_text(PRELOAD_C.replace("MARKER", marker))
    library = tmp_path / "evil.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", library, source], check=True)
    encoded = base64.b64encode(library.read_bytes()).decode()
    result = run(
        files={"evil.b64": encoded},
        steps=[
            {"kind": "bash", "command": "base64 -d evil.b64 > evil.so && echo built"},
            {"kind": "bash", "command": "id -u"},  # exec'd without bash (--direct)
            {"kind": "bash", "command": "true && id -u"},  # through bash
            {"kind": "python", "code": "print('python ran')"},
            {"kind": "read_file", "path": "preload.log"},
        ],
        env={"LD_PRELOAD": "./evil.so", "LD_LIBRARY_PATH": "."},
    )
    assert not os.path.exists(marker), "a root process loaded the job's library"
    assert result.steps[0].stdout == "built\n", result
    assert result.steps[1].stdout.strip() != "0"
    assert result.steps[2].stdout.strip() != "0"
    assert "python ran" in result.steps[3].stdout
    # positive control: the library does load, in every process of the later steps
    loads = result.steps[4].stdout.splitlines()
    assert len(loads) >= 4, result  # id; bash and id; python at the least
    assert "euid=0" not in loads, loads


def test_network_needs_the_operators_consent(run):
    control = run(command="echo should-run")  # the same job without the network runs
    assert control.steps and control.steps[0].stdout == "should-run\n", control
    result = run(command="echo should-not-run", limits={"network": True})
    assert result.status == Status.REJECTED
    assert "limits.network" in result.message
    assert result.steps == []


def test_write_file_onto_a_fifo_does_not_hang(run):
    started = time.monotonic()
    result = run(
        steps=[
            {"kind": "bash", "command": "mkfifo out.txt"},
            {"kind": "write_file", "path": "out.txt", "content": "hi"},
            {"kind": "bash", "command": "cat out.txt"},
        ],
        limits={"timeout_s": 20},
    )
    assert time.monotonic() - started < 15
    assert result.steps[0].status == "succeeded", result  # the fifo was made
    assert result.steps[2].stdout == "hi", result


def test_shared_tmp_does_not_survive_the_job(run):
    secret = f"left-behind-{uuid.uuid4().hex[:8]}"
    first = run(
        command=f"echo {secret} > /tmp/{secret}; echo {secret} > /dev/shm/{secret};"
        f" echo {secret} > /var/tmp/{secret} 2>/dev/null; echo wrote;"
        f" cat /tmp/{secret} /dev/shm/{secret}"
    )
    # the plant: both files written, and readable back within the job
    assert first.steps and first.steps[0].stdout == f"wrote\n{secret}\n{secret}\n", first
    second = run(command=f"cat /tmp/{secret} /dev/shm/{secret} /var/tmp/{secret} 2>&1; echo PROBED")
    assert second.steps and second.steps[0].stdout.endswith("PROBED\n"), second
    assert f"{secret}\n" not in second.steps[0].stdout.replace("No such file", "")
    for where in ("/tmp", "/dev/shm", "/var/tmp"):
        assert not Path(where, secret).exists()  # the host's shared dirs are untouched


def test_sysv_shared_memory_does_not_survive_the_job(run):
    probe = "import ctypes\nprint('found', ctypes.CDLL(None).shmget(0x5AFE, 0, 0o666))\n"
    code = (
        "import ctypes\n"
        "libc = ctypes.CDLL(None)\n"
        "shmid = libc.shmget(0x5AFE, 50 * 1024 * 1024, 0o1666)\n"  # IPC_CREAT | 0666
        "print('segment', shmid)\n" + probe
    )
    planted = run(code=code)
    assert planted.steps, planted
    lines = planted.steps[0].stdout.split()
    # the plant: a segment was made, and the probe finds it within the same job
    assert lines[0] == "segment" and int(lines[1]) >= 0, planted
    assert lines[2:] == ["found", lines[1]], planted
    assert run(code=probe).steps[0].stdout == "found -1\n"


def test_collect_of_large_and_oddly_named_files(run):
    result = run(
        command="head -c 1000000 /dev/zero | tr '\\0' a > zz-big.txt; printf hi > 'new\nline';"
        " printf x > -dash; for i in $(seq 30); do head -c 60000 /dev/zero > y$i.bin; done",
        collect=["*"],
    )
    assert result.status == Status.SUCCEEDED, result
    by_name = {f.path: f for f in result.files}
    assert by_name["new\nline"].content == "hi"
    assert by_name["-dash"].content == "x"
    assert sum(len(f.content) for f in result.files) <= 1024 * 1024 * 4 // 3 + 1
    assert len(result.files) + result.files_omitted == 33


def test_read_file_of_a_large_file(run):
    result = run(
        steps=[
            {
                "kind": "bash",
                "command": "(echo FIRST; head -c 3000000 /dev/zero; echo; echo LAST) > f",
            },
            {"kind": "read_file", "path": "f"},
        ]
    )
    step = result.steps[1]
    assert result.status == Status.SUCCEEDED, result
    assert step.stdout.startswith("FIRST") and step.stdout.endswith("LAST\n")
    assert step.stdout_bytes == 6 + 3_000_000 + 1 + 5
    assert step.truncated


STOPPER = """
import os, signal
while True:
    try:
        os.kill(-1, signal.SIGSTOP)
    except OSError:
        pass
"""


def _state(pid: int) -> str:
    try:
        return next(
            line.split()[1]
            for line in Path(f"/proc/{pid}/status").read_text().splitlines()
            if line.startswith("State:")
        )
    except (OSError, StopIteration):
        return "gone"


@pytest.mark.no_backend
def test_sweep_cannot_be_stopped_by_a_leftover(is_root):
    """A leftover looping kill(-1, SIGSTOP) as the slot uid cannot freeze the sweeper."""
    require(is_root, "slot uids need root")
    uid = 61000 + 250  # a slot no test or worker uses
    victim = subprocess.Popen(["/bin/sleep", "60"], user=uid, group=uid, start_new_session=True)
    stopper = subprocess.Popen(
        [
            "/usr/bin/python3",  # readable by any uid, unlike the venv's interpreter
            "-c",
            STOPPER,
        ],
        user=uid,
        group=uid,
        start_new_session=True,
    )
    try:
        # positive control: the stopper really freezes what it can reach
        deadline = time.monotonic() + 5
        while _state(victim.pid) != "T" and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _state(victim.pid) == "T", "the stopper never stopped its victim"
        assert stopper.poll() is None  # and still runs
        started = time.monotonic()
        assert sweep_uid(uid)
        assert time.monotonic() - started < 5
        assert pids_of_uid(uid) == []
    finally:
        for proc in (stopper, victim):
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait()


# --- second review ---------------------------------------------------------------------


KEYS = (
    "import ctypes, os\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "x86 = os.uname().machine == 'x86_64'\n"
    "add_key, keyctl = (248, 250) if x86 else (217, 219)\n"
)


def test_no_new_user_namespaces(run):
    # positive control: an unprivileged host process may make one here
    host = subprocess.run(["unshare", "-Ur", "true"], user=NOBODY, group=NOBODY)
    if host.returncode != 0:
        pytest.skip("user namespaces are off for unprivileged users here: nothing to refuse")
    code = (
        "import ctypes, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "print('unshare', libc.unshare(0x10000000), ctypes.get_errno())\n"  # CLONE_NEWUSER
    )
    refused = run(code=code).steps[0].stdout.split()
    assert refused[:2] == ["unshare", "-1"] and int(refused[2]) != 0, refused
    shell = run(command="unshare -Urm true && echo ESCAPED || echo REFUSED")
    assert shell.steps[0].stdout == "REFUSED\n", shell


def test_kernel_keyrings_do_not_outlive_the_job(run):
    """Blocked outright (process: seccomp; docker: its profile) or private to the job's
    own user namespace (bwrap): the next job of the slot never finds the key."""
    name = f"sandfarm-k-{uuid.uuid4().hex[:8]}".encode()
    plant = KEYS + (
        f"serial = libc.syscall(add_key, b'user', {name!r}, b'tenant-secret', 13,"
        " ctypes.c_int(-4))\n"  # KEY_SPEC_USER_KEYRING
        "print('add_key', serial, ctypes.get_errno())\n"
    )
    search = KEYS + (
        f"print('found', libc.syscall(keyctl, 10, ctypes.c_int(-4), b'user', {name!r}, 0))\n"
    )  # KEYCTL_SEARCH
    # positive control: unconfined on the host, the plant works and the search finds it
    # (then KEYCTL_INVALIDATE removes it)
    host = subprocess.run(
        ["/usr/bin/python3", "-c", plant + search + "libc.syscall(keyctl, 21, serial)\n"],
        user=NOBODY,
        group=NOBODY,
        capture_output=True,
        text=True,
    )
    host_out = host.stdout.split()
    assert host_out[:1] == ["add_key"] and int(host_out[1]) > 0, host
    assert host_out[3:] == ["found", host_out[1]], host
    planted = run(code=plant + search)
    assert planted.steps, planted
    out = planted.steps[0].stdout.split()
    assert out[0] == "add_key", planted  # the plant ran in the job
    if int(out[1]) > 0:  # allowed (in the job's own keyring): then found within the job
        assert out[3:] == ["found", out[1]], planted
    else:  # or refused outright: EPERM (seccomp), ENOSYS or EACCES
        assert int(out[2]) in (errno.EPERM, errno.ENOSYS, errno.EACCES), planted
    assert run(code=search).steps[0].stdout == "found -1\n"


def test_host_unix_sockets_under_run_are_out_of_reach(run):
    import socket

    path = Path(f"/run/sandfarm-test-{uuid.uuid4().hex[:8]}.sock")
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    path.chmod(0o777)
    server.listen()
    server.settimeout(0.5)
    try:
        # positive control: an unprivileged host process (no sandbox) gets in
        subprocess.run(
            [
                "/usr/bin/python3",
                "-c",
                "import socket, sys\nsocket.socket(socket.AF_UNIX).connect(sys.argv[1])",
                str(path),
            ],
            user=NOBODY,
            group=NOBODY,
            check=True,
        )
        server.accept()[0].close()
        code = (
            "import socket\n"
            "s = socket.socket(socket.AF_UNIX)\n"
            "try:\n"
            f"    s.connect({str(path)!r}); print('CONNECTED')\n"
            "except OSError as exc:\n"
            "    print('refused', exc.errno)\n"
        )
        result = run(code=code)
        assert result.steps and "refused" in result.steps[0].stdout, result  # it tried
        assert "CONNECTED" not in result.steps[0].stdout, result
        try:
            server.accept()
            accepted = True
        except TimeoutError:
            accepted = False
        assert not accepted
    finally:
        server.close()
        path.unlink()


def test_other_jobs_command_lines_are_invisible(run):
    import threading

    marker = f"sandfarm-secret-arg-{uuid.uuid4().hex[:8]}"
    holder: dict = {}
    thread = threading.Thread(
        target=lambda: holder.setdefault("r", run(command=f"exec -a {marker} sleep 5"))
    )
    thread.start()
    seen_on_host = wait_until(
        lambda: any(marker.encode() in cmdline for cmdline in _cmdlines()), thread, 10
    )
    own = f"sandfarm-own-arg-{uuid.uuid4().hex[:8]}"  # the spy's control: it sees its own
    spy = run(
        command=f"(exec -a {own} sleep 5) & sleep 0.2; "
        "cat /proc/*/cmdline 2>/dev/null | tr '\\0' ' '; echo; kill %1"
    )
    still_there = any(marker.encode() in cmdline for cmdline in _cmdlines())
    thread.join(30)
    assert seen_on_host, "the other job never ran: nothing to hide"
    assert still_there, "the other job ended before the spy looked"
    assert spy.steps and own in spy.steps[0].stdout, spy
    assert marker not in spy.steps[0].stdout


def _cmdlines():
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                yield (entry / "cmdline").read_bytes()


def test_odd_names_and_signals_never_turn_a_result_into_error(run):
    import json

    result = run(
        steps=[
            {
                "kind": "bash",
                "command": "printf hi > $(printf 'bad\\377name.txt'); printf t > 'x\\ty'",
            },
            {"kind": "bash", "command": "kill -40 $$"},
            {"kind": "bash", "command": "echo after"},
        ],
        collect=["*"],
    )
    json.loads(result.model_dump_json())  # serialisable whatever the names
    assert result.status == Status.CRASHED, result
    assert "40" in result.steps[1].message
    assert result.steps[2].stdout == "after\n"
    contents = {f.path: f.content for f in result.files}
    assert contents.get("x\\ty") == "t"
    assert any(name.startswith("bad") and f == "hi" for name, f in contents.items())


def test_a_leftover_killing_everything_cannot_break_the_next_step(run):
    killer = "echo $$ > killer.pid; while :; do kill -9 -1; done"
    leftover = f"nohup setsid sh -c '{killer}' >/dev/null 2>&1 & sleep 5; echo NOT-KILLED"
    result = run(
        steps=[
            {"kind": "bash", "command": leftover},
            {"kind": "bash", "command": "echo second"},
        ],
        collect=["*"],
    )
    assert result.status != Status.ERROR, result
    # positive control: the leftover started, and killed its own step
    files = {f.path: f for f in result.files}
    assert "killer.pid" in files, result
    pid = files["killer.pid"].content
    if files["killer.pid"].encoding == "base64":
        pid = base64.b64decode(pid).decode()
    assert int(pid) > 0
    first = result.steps[0]
    assert (first.status, first.signal, first.stdout) == ("crashed", 9, ""), result
    assert result.steps[1].stdout == "second\n"


# Loaded into pid 1 (our init, /.sandfarm/init --init STATUS_FD), it writes a forged
# status record ("exited 0") to the init's status pipe and sends the real one nowhere.
FORGES_STATUS_C = r"""
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
__attribute__((constructor)) static void forge(void) {
    if (getpid() != 1) return;
    char buf[4096] = {0};
    int fd = open("/proc/self/cmdline", O_RDONLY);
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    int status_fd = -1;
    for (char *p = buf; p < buf + n; p += strlen(p) + 1)
        if (strcmp(p, "--init") == 0) { status_fd = atoi(p + strlen(p) + 1); break; }
    if (status_fd < 0) return;
    dprintf(status_fd, "status=0 cpu_us=1 maxrss_kb=1\n");
    int null = open("/dev/null", O_WRONLY);
    dup2(null, status_fd);
}
"""


def test_a_dynamic_exec_helper_is_never_bwraps_init(tmp_path):
    """A cold bwrap step's init gets the job's environment, so a dynamically linked
    helper (the Makefile's fallback where -static fails) would load the job's LD_PRELOAD
    into pid 1, which writes the step's status (an attack review: `exit 1` read as
    `succeeded`). Only a static helper is the init; a dynamic one leaves it to tini or
    bwrap's own."""
    from tests.security.conftest import bwrap_status, make_backend

    require(*bwrap_status())  # only bwrap runs the exec helper as the sandbox's pid 1
    require(shutil.which("cc") is not None, "no C compiler to build the helper and library")
    native = Path(__file__).resolve().parents[2] / "sandbox_core" / "native"
    dynamic = tmp_path / "sandfarm-exec-dynamic"
    subprocess.run(["cc", "-O2", "-o", dynamic, native / "sandfarm-exec.c"], check=True)
    source = tmp_path / "forge.c"
    source.write_text(FORGES_STATUS_C)
    library = tmp_path / "forge.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", library, source], check=True)
    job = {
        "files": {"forge.b64": base64.b64encode(library.read_bytes()).decode()},
        "steps": [
            {"kind": "bash", "command": "base64 -d forge.b64 > forge.so && echo built"},
            {"kind": "bash", "command": 'echo "preloading $LD_PRELOAD"; exit 1'},
        ],
        "env": {"LD_PRELOAD": "/workspace/forge.so"},
        "backend": "bwrap",
    }
    # judged again when the file changes: a helper rebuilt under a running worker
    from sandbox_core.childsetup import statically_linked

    static = tmp_path / "sandfarm-exec-rebuilt"
    subprocess.run(["cc", "-O2", "-static", "-o", static, native / "sandfarm-exec.c"], check=True)
    assert statically_linked(str(static))
    shutil.copyfile(dynamic, static)
    assert not statically_linked(str(static))
    sandbox = make_backend("bwrap", exec_helper=str(dynamic), prewarm=False)
    try:
        assert not sandbox.own_init  # a dynamic helper is not the init
        result = sandbox.run(parse_spec(job))
    finally:
        sandbox.close()
    assert result.steps[0].stdout == "built\n", result  # the library is there ...
    assert result.steps[1].stdout == "preloading /workspace/forge.so\n", result  # ... loaded
    assert result.status == Status.FAILED and result.steps[1].exit_code == 1, result

"""Attacks from the independent security review, each proved to fail on every backend."""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path

from sandbox_core import Status
from sandbox_core.sweep import pids_of_uid, sweep_uid
from tests.conftest import require

PRELOAD_C = r"""
#include <stdio.h>
#include <unistd.h>
__attribute__((constructor)) static void pwn(void) {
    if (geteuid() == 0) {
        FILE *f = fopen("%s", "w");
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
    source.write_text(PRELOAD_C % marker)
    library = tmp_path / "evil.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", library, source], check=True)
    encoded = base64.b64encode(library.read_bytes()).decode()
    result = run(
        files={"evil.b64": encoded},
        steps=[
            {"kind": "bash", "command": "base64 -d evil.b64 > evil.so && echo built"},
            {"kind": "bash", "command": "id -u"},
            {"kind": "python", "code": "print('python ran')"},
        ],
        env={"LD_PRELOAD": "./evil.so", "LD_LIBRARY_PATH": "."},
    )
    assert not os.path.exists(marker), "a root process loaded the job's library"
    assert result.steps[1].stdout.strip() != "0"
    assert "python ran" in result.steps[2].stdout


def test_network_needs_the_operators_consent(run):
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
    assert result.steps[2].stdout == "hi", result


def test_shared_tmp_does_not_survive_the_job(run):
    secret = f"left-behind-{uuid.uuid4().hex[:8]}"
    first = run(
        command=f"echo {secret} > /tmp/{secret}; echo {secret} > /dev/shm/{secret};"
        f" echo {secret} > /var/tmp/{secret} 2>/dev/null; echo wrote"
    )
    assert "wrote" in first.steps[0].stdout
    second = run(command=f"cat /tmp/{secret} /dev/shm/{secret} /var/tmp/{secret} 2>&1; true")
    assert f"{secret}\n" not in second.steps[0].stdout.replace("No such file", "")
    for where in ("/tmp", "/dev/shm", "/var/tmp"):
        assert not Path(where, secret).exists()  # the host's shared dirs are untouched


def test_sysv_shared_memory_does_not_survive_the_job(run):
    code = (
        "import ctypes\n"
        "libc = ctypes.CDLL(None)\n"
        "shmid = libc.shmget(0x5AFE, 50 * 1024 * 1024, 0o1666)\n"  # IPC_CREAT | 0666
        "print('segment', shmid)\n"
    )
    assert "segment" in run(code=code).steps[0].stdout
    probe = "import ctypes\nprint('found', ctypes.CDLL(None).shmget(0x5AFE, 0, 0o666))\n"
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


def test_sweep_cannot_be_stopped_by_a_leftover(is_root):
    """A leftover looping kill(-1, SIGSTOP) as the slot uid cannot freeze the sweeper."""
    require(is_root, "slot uids need root")
    uid = 61000 + 250  # a slot no test or worker uses
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
        time.sleep(0.3)
        started = time.monotonic()
        assert sweep_uid(uid)
        assert time.monotonic() - started < 5
        assert pids_of_uid(uid) == []
    finally:
        if stopper.poll() is None:
            os.kill(stopper.pid, signal.SIGKILL)
        stopper.wait()


# --- second review ---------------------------------------------------------------------


KEYS = (
    "import ctypes, os\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "x86 = os.uname().machine == 'x86_64'\n"
    "add_key, keyctl = (248, 250) if x86 else (217, 219)\n"
)


def test_no_new_user_namespaces(run):
    code = (
        "import ctypes, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "print('unshare', libc.unshare(0x10000000))\n"  # CLONE_NEWUSER
    )
    assert "unshare -1" in run(code=code).steps[0].stdout
    shell = run(command="unshare -Urm true && echo ESCAPED; true")
    assert "ESCAPED" not in shell.steps[0].stdout


def test_kernel_keyrings_do_not_outlive_the_job(run):
    """Blocked outright (process: seccomp; docker: its profile) or private to the job's
    own user namespace (bwrap): the next job of the slot never finds the key."""
    plant = KEYS + (
        "print('add_key', libc.syscall(add_key, b'user', b'sandfarm-k', b'tenant-secret', 13,"
        " ctypes.c_int(-4)))\n"  # KEY_SPEC_USER_KEYRING
    )
    run(code=plant)
    search = KEYS + (
        "print('found', libc.syscall(keyctl, 10, ctypes.c_int(-4), b'user', b'sandfarm-k', 0))\n"
    )  # KEYCTL_SEARCH
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
        code = (
            "import socket\n"
            "s = socket.socket(socket.AF_UNIX)\n"
            "try:\n"
            f"    s.connect({str(path)!r}); print('CONNECTED')\n"
            "except OSError as exc:\n"
            "    print('refused', exc.errno)\n"
        )
        result = run(code=code)
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
        target=lambda: holder.setdefault("r", run(command=f"exec -a {marker} sleep 3"))
    )
    thread.start()
    seen_on_host = False
    deadline = time.monotonic() + 10
    while not seen_on_host and time.monotonic() < deadline:
        seen_on_host = any(marker.encode() in cmdline for cmdline in _cmdlines())
        time.sleep(0.05)
    spy = run(command="cat /proc/*/cmdline 2>/dev/null | tr '\\0' ' '; echo")
    thread.join(30)
    assert seen_on_host, "the other job never ran: nothing to hide"
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
    result = run(
        steps=[
            {
                "kind": "bash",
                "command": "nohup setsid sh -c 'while :; do kill -9 -1; done' >/dev/null 2>&1 &",
            },
            {"kind": "bash", "command": "echo second"},
        ],
        collect=["*"],
    )
    assert result.status != Status.ERROR, result
    assert result.steps[1].stdout == "second\n"

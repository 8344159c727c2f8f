"""Attacks from the independent security review, each proved to fail on every backend."""

from __future__ import annotations

import base64
import os
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path

from sandbox_core import Status
from sandbox_core.isolation import pids_of_uid, sweep_uid
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

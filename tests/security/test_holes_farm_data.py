"""The farm's own data is out of every job's view: the broker's files (every queued spec
with its env secrets, every result) and other jobs' workspaces and ptys."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest
import redis

from sandbox_core import slots
from sandbox_core.backends import prewarm
from tests.conftest import job_shared_dir, require

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:  # a rewrite's temporary file, gone meanwhile
        return b""


def test_the_brokers_files_are_unreadable(run, is_root, tmp_path):
    """ops/start_redis.sh (what ops/services.sh starts) keeps its AOF private."""
    require(is_root, "slot uids need root")
    require(shutil.which("redis-server") is not None, "redis-server is not installed")
    port, data = _free_port(), Path("/var/lib/sandfarm-tests") / f"redis-{uuid.uuid4().hex[:8]}"
    secret = f"secret-env-{uuid.uuid4().hex}"
    subprocess.run([ROOT / "ops/start_redis.sh", str(port), str(data)], check=True)
    client = redis.Redis(port=port)
    try:
        for _ in range(100):
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        client.set("sandfarm:job:x", f'{{"env": {{"TOKEN": "{secret}"}}}}')
        client.execute_command("BGREWRITEAOF")
        deadline = time.monotonic() + 10
        files: list[Path] = []
        while time.monotonic() < deadline and not files:
            time.sleep(0.1)
            if client.info("persistence")["aof_rewrite_in_progress"]:
                continue
            files = [
                p for p in data.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()
            ]
        assert files, "the secret never reached the AOF (the plant failed)"
        readable = job_shared_dir("sandfarm-readable-") / "open.txt"
        readable.write_text("world-readable\n")
        readable.chmod(0o644)
        paths = " ".join(str(p) for p in [readable, *files])
        result = run(command=f"for f in {paths}; do cat $f 2>&1; echo; done; ls -la {data} 2>&1")
        out = result.steps[0].stdout if result.steps else ""
        if result.backend == "process":  # L1 sees the host's files: the control must read
            assert "world-readable" in out, result
        else:
            assert "No such file" in out or "world-readable" in out, result
        assert secret not in out and secret not in result.steps[0].stderr
        assert (data.stat().st_mode & 0o077) == 0
        assert all((p.stat().st_mode & 0o077) == 0 for p in files)
    finally:
        with contextlib.suppress(redis.RedisError):
            client.shutdown(nosave=True)
        shutil.rmtree(data, ignore_errors=True)


PLANT = """
import os, pty, time, stat
main, sub = pty.openpty()
os.chmod(os.ttyname(sub), 0o666)
os.chmod('.', 0o777)
open('planted.txt', 'w').write('{secret}')
os.chmod('planted.txt', 0o666)
print('PLANTED', os.getcwd(), os.ttyname(sub), flush=True)
time.sleep(10)
"""

PROBE = """
import glob, os
mine = [l.split()[4] for l in open('/proc/self/mountinfo') if 'sandfarm' in l]
print('MOUNTS', mine)
print('PTS', sorted(os.listdir('/dev/pts')))
found = []
for path in glob.glob('{base}/slot-*/job-*/work/planted.txt'):
    try:
        found.append(open(path).read())
    except OSError as exc:
        found.append(f'denied {{exc.errno}}')
print('FOUND', found)
"""


def test_other_jobs_workspaces_and_ptys_are_invisible(run, backend, is_root):
    require(is_root, "slot uids need root")
    if backend.name == "docker":
        pytest.skip("a container's workspace is inside it, never on the host's filesystem")
    secret = f"cross-slot-{uuid.uuid4().hex}"
    base = str(slots.workspace_base())
    planted: dict = {}
    thread = threading.Thread(
        target=lambda: planted.update(result=run(code=PLANT.format(secret=secret)))
    )
    thread.start()
    deadline = time.monotonic() + 10
    work = None
    while work is None and time.monotonic() < deadline:  # find the plant from the host
        hits = [p for p in Path(base).glob("slot-*/job-*/work/planted.txt") if p.exists()]
        work = hits[0] if hits else None
        if work is None and not thread.is_alive():  # it ended (or never ran) without one
            break
        time.sleep(0.05)
    assert work is not None and work.read_text() == secret, "the plant never landed"
    assert work.parent.stat().st_mode & 0o777 == 0o777  # world-accessible, on purpose
    probe = run(code=PROBE.format(base=base))
    thread.join(20)
    out = probe.steps[0].stdout if probe.steps else ""
    assert out.startswith("MOUNTS"), probe  # the probe ran
    assert secret not in out
    assert str(work.parents[1]) not in out  # not even the other job's path
    assert "PTS ['ptmx']" in out  # its own pty instance: the other job's pty is not there
    assert "PLANTED" in planted["result"].steps[0].stdout  # the plant job ran to its end
    # ... and the probe looked while the plant was there
    assert probe.timings.finished_at < planted["result"].timings.finished_at
    prewarm.settle()  # torn down after its result, off the job's critical path
    assert os.path.exists(work) is False  # and its workspace is gone with it

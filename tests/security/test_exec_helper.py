"""The C exec helper and the Python child setup give a job the same confinement."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import pytest

from sandbox_core import get_backend, landlock, parse_spec
from sandbox_core.childsetup import ChildSetup, find_exec_helper
from tests.conftest import require

PROBE = """
echo uid=$(id -u) groups=$(id -G)
echo as=$(ulimit -v) nproc=$(ulimit -u) fsize=$(ulimit -f) nofile=$(ulimit -n) core=$(ulimit -c)
echo umask=$(umask)
echo nnp=$(awk '/^NoNewPrivs/ {print $2}' /proc/self/status)
echo capeff=$(awk '/^CapEff/ {print $2}' /proc/self/status)
echo ifaces=$(tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | sort | tr '\\n' ,)
echo fds=$(ls /proc/self/fd | sort -n | tr '\\n' ,)
echo cgroups=$(grep -c sandfarm /proc/self/cgroup)
echo cgview=$(ls -A /sys/fs/cgroup | wc -l)
echo memcg=$(awk -F: '$2 == "memory" {print "/sys/fs/cgroup/memory" $3 "/memory.limit_in_bytes"}
    $1 == "0" {print "/sys/fs/cgroup" $3 "/memory.max"}' /proc/self/cgroup | tr '\n' ,)
"""


KEYS = (
    "uid",
    "groups",
    "as",
    "nproc",
    "fsize",
    "nofile",
    "core",
    "umask",
    "nnp",
    "capeff",
    "ifaces",
    "fds",
    "cgroups",
    "cgview",
    "memcg",
)


def _probe(helper: str) -> dict[str, str]:
    backend = get_backend("process", exec_helper=helper)
    try:
        result = backend.run(parse_spec({"command": PROBE, "limits": {"memory_mb": 300}}))
        assert result.status == "succeeded", result
        found = dict(
            item.split("=", 1)
            for line in result.steps[0].stdout.splitlines()
            for item in line.split()
        )
        # the job's memory limit, read where the job cannot (the tree is out of its view)
        limit_files = [Path(f) for f in found.get("memcg", "").split(",") if f]
        found["memcg"] = next((f.read_text().strip() for f in limit_files if f.is_file()), "")
    finally:
        backend.close()
    # the probe ran to its end: every reading is there
    assert set(found) == set(KEYS), result
    return found


def test_helper_and_python_setup_agree(is_root):
    helper = find_exec_helper("auto")
    require(helper is not None, "sandfarm-exec is not built (make setup compiles it)")
    require(is_root, "the confinement under test needs root")
    assert helper is not None
    with_helper = _probe(helper)
    in_python = _probe("")
    assert with_helper == in_python
    assert with_helper["uid"] != "0" and with_helper["groups"] == with_helper["uid"]
    # The memory bound is the job's cgroup (an OOM kill there is memory_exceeded); an
    # address-space rlimit would fail allocations first and let a job fake that status.
    assert with_helper["as"] == "unlimited"
    assert with_helper["memcg"] == str(300 * 1024 * 1024)
    assert with_helper["core"] == "0" and with_helper["nnp"] == "1"
    assert with_helper["capeff"] == "0000000000000000"
    assert with_helper["ifaces"] == "lo,"
    assert with_helper["fds"] == "0,1,2,3,"  # 3 is ls's own: no netns or lock fd leaks
    assert int(with_helper["cgroups"]) >= 1
    assert with_helper["cgview"] == "0"  # no slot's cgroup counters in view


@pytest.mark.no_backend  # the two setups themselves, no backend
def test_helper_and_python_setup_both_confine_unix_sockets(tmp_path):
    """Each puts the job in a Landlock domain (landlock.py) where an abstract Unix
    socket made outside it is refused, and socket files are made only beneath the
    directories given, nor moved out of them; files still move and link across
    directories (handling a file right refused that: ``git mv`` failed, a review).
    Without it the same program reaches the socket and does all the rest."""
    require(landlock.scopes_abstract_unix(), landlock.why_unscoped() or "")
    helper = find_exec_helper("auto")
    require(helper is not None, "sandfarm-exec is not built (make setup compiles it)")
    assert helper is not None
    name = f"sandfarm-test-scope-{os.getpid()}"
    own, elsewhere = tmp_path / "own", tmp_path / "elsewhere"
    own.mkdir()
    elsewhere.mkdir()
    program = [
        "/usr/bin/python3",
        "-c",
        "import errno, os, socket, sys\n"
        "def outcome(call, at):\n"
        "    try:\n        call(at); return 'ok'\n"
        "    except OSError as exc:\n        return errno.errorcode[exc.errno]\n"
        "new = lambda: socket.socket(socket.AF_UNIX)\n"
        "own, elsewhere = sys.argv[1:]\n"
        "def moves(to):\n"
        "    os.makedirs(os.path.join(own, 'sub'), exist_ok=True)\n"
        "    made = os.path.join(own, 'sub', 'f'); open(made, 'w').close()\n"
        "    os.rename(made, to); os.link(to, made)\n"
        "def moves_socket(to):\n"
        "    made = os.path.join(own, 'sock' + str(os.getpid())); new().bind(made)\n"
        "    os.rename(made, to)\n"
        f"print(outcome(new().connect, '\\0{name}'),\n"
        "      *(outcome(new().bind, os.path.join(d, str(os.getpid()))) for d in sys.argv[1:]),\n"
        "      outcome(moves, os.path.join(elsewhere, 'f' + str(os.getpid()))),\n"
        "      outcome(moves_socket, os.path.join(elsewhere, 's' + str(os.getpid()))))\n",
        str(own),
        str(elsewhere),
    ]
    scoped = ChildSetup(landlock_scope=landlock.SCOPE_ABSTRACT_UNIX_SOCKET, sock_dirs=[str(own)])
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(f"\0{name}")
        server.listen(8)

        def run(argv: list[str], setup: ChildSetup | None = None) -> str:
            done = subprocess.run(
                argv, capture_output=True, text=True, preexec_fn=setup, timeout=30
            )
            return done.stdout + done.stderr

        assert run(program) == "ok ok ok ok ok\n"  # the control: unconfined, all work
        assert run(program, ChildSetup()) == "ok ok ok ok ok\n"  # and with nothing asked
        assert run(program, scoped) == "EPERM ok EACCES ok EACCES\n"
        argv = scoped.helper_argv(helper, env_fd=None)
        assert argv is not None and "--landlock-sock-dir" in argv
        assert run([*argv, *program]) == "EPERM ok EACCES ok EACCES\n"

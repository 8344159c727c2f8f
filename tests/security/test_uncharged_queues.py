"""Netlink and ping sockets are refused to jobs: the replies the kernel queues on one
are charged to no cgroup. An attack review (2026-12-05) held ~795 MB of the host's
unreclaimable kernel memory from a job of 64 MB with 100 route sockets (SO_RCVBUF raised
to the host's rmem_max, each failed request's acknowledgement echoing it back),
unbounded at the default limits' 16,384 descriptors; a second one 162 MB with 20 ping
sockets from a docker job.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

from sandbox_core import Status
from tests.conftest import require

# Opens SOCKETS route netlink sockets and queues unread acknowledgements on each (a
# request the kernel refuses is echoed back whole), then reads them back to count them;
# prints how many bytes it had queued.
QUEUES_NETLINK_REPLIES = """
import os, socket, struct
SOCKETS = int(os.environ["SOCKETS"])
queued = 0
keep = []
for _ in range(SOCKETS):
    try:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)
    except OSError as exc:
        print("refused", exc.errno); raise SystemExit(0)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
    body = bytes(65536)  # a request of no type the kernel knows (0x1ff), acknowledged
    request = struct.pack("=IHHII", 16 + len(body), 0x1FF, 5, 1, 0) + body
    for _ in range(16):
        sock.send(request)
    sock.setblocking(False)
    while True:  # read back what was queued, to count it
        try:
            queued += len(sock.recv(1 << 20))
        except BlockingIOError:
            break
    keep.append(sock)
print("queued", queued)
"""


def _memory_group_usage(group: Path) -> int:
    return int((group / "memory.max_usage_in_bytes").read_text())


def test_netlink_replies_charged_to_nobody_are_out_of_a_jobs_reach(run, tmp_path):
    require(os.geteuid() == 0, "needs root: a memory cgroup to show what is not charged")
    group = Path("/sys/fs/cgroup/memory", f"sandfarm-test-netlink-{os.getpid()}")
    if not group.parent.joinpath("memory.max_usage_in_bytes").exists():
        require(False, "cgroup v1's memory controller (the attack's control measures there)")
    group.mkdir(exist_ok=True)
    script = tmp_path / "queue.py"
    script.write_text(
        f"import os\nopen('{group}/cgroup.procs', 'w').write(str(os.getpid()))\n"
        f"exec(compile({QUEUES_NETLINK_REPLIES!r}, 'queue', 'exec'))\n"
    )
    try:
        bare = subprocess.run(
            [sys.executable, str(script)],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "SOCKETS": "4"},
        )
        peak = _memory_group_usage(group)
    finally:
        group.rmdir()
    # The attack works outside: 4 sockets queued ~4 MB of replies, while the process's
    # memory cgroup, interpreter and all, peaked below what was queued.
    assert bare.returncode == 0, bare
    word, queued = bare.stdout.split()
    assert word == "queued" and int(queued) > 4 * 1_000_000, bare.stdout
    assert peak < int(queued), (peak, queued)
    result = run(code=QUEUES_NETLINK_REPLIES, env={"SOCKETS": "4"})
    assert result.status == Status.SUCCEEDED, result
    assert result.steps[0].stdout == f"refused {errno.EAFNOSUPPORT}\n", result
    assert run(command="echo host-ok").steps[0].stdout == "host-ok\n"


# Opens an ICMP echo ("ping") socket, as any user may where the namespace's
# net.ipv4.ping_group_range lets it, and reads back its own echo from loopback.
PINGS_ITSELF = """
import socket, struct
try:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP)
except OSError as exc:
    print("refused", exc.errno); raise SystemExit(0)
sock.settimeout(5)
sock.sendto(struct.pack("!BBHHH", 8, 0, 0, 0, 1) + b"x" * 56, ("127.0.0.1", 0))
print("echoed", len(sock.recv(4096)))
"""


def test_jobs_get_no_ping_sockets(run, backend):
    """The engine opens ping sockets to every gid of a container's namespace, and the
    replies queued on one are charged to no cgroup (an attack review, 2026-12-05: 20 of
    them held 162 MB of the host's unreclaimable memory from a 64 MB docker job)."""
    if backend.name == "docker":  # the control: a plain container as the engine makes it
        out = backend.client.containers.run(
            backend.image, ["python3", "-c", PINGS_ITSELF], user="65534", remove=True
        )
        assert out.decode() == "echoed 64\n", out  # the attack's socket, and its queue
    result = run(code=PINGS_ITSELF)
    assert result.status == Status.SUCCEEDED, result
    assert result.steps[0].stdout == f"refused {errno.EACCES}\n", result

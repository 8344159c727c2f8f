"""What a slot's last job leaves behind after its processes are gone, for the slot's
next job (maybe another tenant's) to read: each session gets its own network namespace
(sandbox_core.slots.Slot.end_session), and no job sees the host's cgroup tree. Each test
runs two jobs in one slot, first proving the first job's leftovers are there to find."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

from sandbox_core import Status, cgroups, parse_spec
from tests.security.conftest import make_backend
from tests.security.helpers import backend_kind

SLOT = 241  # one slot, so the jobs follow each other in it (out of the other tests' way)


# Job A leaves what a network namespace keeps after its processes are gone: a TIME_WAIT
# socket on the port, a megabyte on loopback's counters. Both jobs then report what they
# see of it (their uid: the same slot).
LEAVES_SOCKETS = """
import socket
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", {port})); srv.listen(1)
client = socket.create_connection(("127.0.0.1", {port})); server, _ = srv.accept()
client.sendall(b"S" * 1_000_000)
got = 0
while got < 1_000_000:
    got += len(server.recv(1 << 20))
server.close(); client.close(); srv.close()
"""
SEES_LOOPBACK = """
import os, socket
lo = next(line for line in open("/proc/net/dev") if line.strip().startswith("lo:")).split()
tcp = open("/proc/net/tcp").read().splitlines()[1:]
try:
    socket.socket().bind(("127.0.0.1", {port})); bound = "bound"
except OSError as exc:
    bound = f"bind failed: {{exc.strerror}}"
print(os.getuid(), lo[1], len(tcp), bound, sep="|")
"""


@pytest.mark.parametrize("prewarm", [True, False], ids=["prewarmed", "cold"])
def test_the_next_job_in_a_slot_finds_a_fresh_loopback(backend, prewarm):
    """A slot's jobs, one tenant's after another's, share no network namespace: nothing
    the last one did on loopback (its ports in TIME_WAIT, its traffic) reaches the next,
    neither as a covert channel nor as a port it cannot bind for a minute."""
    kind = backend_kind(backend)
    options = {} if kind == "docker" else {"prewarm": prewarm}
    sandbox = make_backend(kind, slot=SLOT, **options)
    port = 20000 + os.getpid() % 20000
    try:
        first = sandbox.run(
            parse_spec({"code": LEAVES_SOCKETS.format(port=port) + SEES_LOOPBACK.format(port=port)})
        )
        second = sandbox.run(parse_spec({"code": SEES_LOOPBACK.format(port=port)}))
    finally:
        sandbox.close()
    assert first.status == Status.SUCCEEDED and second.status == Status.SUCCEEDED, (first, second)
    uid_a, rx_a, tcp_a, bind_a = first.steps[0].stdout.strip().split("|")
    uid_b, rx_b, tcp_b, bind_b = second.steps[0].stdout.strip().split("|")
    # the attack ran: job A's namespace holds its traffic and its port in TIME_WAIT
    assert int(rx_a) >= 1_000_000 and int(tcp_a) >= 1, first.steps[0].stdout
    assert bind_a == "bind failed: Address already in use", first.steps[0].stdout
    assert uid_a == uid_b  # the same slot, one job after the other
    # ... and job B sees none of it
    assert (int(rx_b), int(tcp_b), bind_b) == (0, 0, "bound"), second.steps[0].stdout


# Every cgroup counter file the job can read: its own groups' (by /proc/self/cgroup) and
# those at the host paths it is given (HOST: the slot's group), and what /sys/fs/cgroup
# lists.
READS_COUNTERS = r"""
import glob, os
paths = list(HOST)
for line in open("/proc/self/cgroup"):
    _, controllers, path = line.rstrip("\n").split(":", 2)
    for under in ("/unified", "", "/" + controllers, "/cpuacct", "/memory", "/pids"):
        paths += glob.glob(f"/sys/fs/cgroup{under}{path}/*.stat")
        paths += glob.glob(f"/sys/fs/cgroup{under}{path}/*.usage*")
readable = []
for name in paths:
    try:
        open(name).read()
        readable.append(name)
    except OSError:
        pass
listed = len(os.listdir("/sys/fs/cgroup")) if os.path.isdir("/sys/fs/cgroup") else 0
print(f"{os.getuid()}|{len(readable)}|{listed}|{readable[:3]}")
"""
BURNS_CPU = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\n"


def _host_counter_files() -> list[str]:
    """The slot's group's CPU counters, as the host sees them."""
    layout = cgroups.detect()
    found = []
    for base in layout.bases:
        for name in ("cpu.stat", "cpuacct.usage", "memory.stat", "pids.current"):
            if (base / f"slot{SLOT}" / name).is_file():
                found.append(str(base / f"slot{SLOT}" / name))
    return found


def test_no_job_reads_a_slots_cgroup_counters(backend):
    """A cgroup's counters add up over its life (CPU usage, peaks, events), and every
    slot's are in the host's tree: a job must read neither its slot's (the last job's
    CPU time, maybe another tenant's) nor another slot's (a job running now)."""
    kind = backend_kind(backend)
    sandbox = make_backend(kind, slot=SLOT)
    try:
        first = sandbox.run(parse_spec({"code": BURNS_CPU}))
        host_files = _host_counter_files()
        spent = cgroups.JobCgroup(f"slot{SLOT}", cgroups.detect()).cpu_ns() / 1e6
        world_readable = all(os.stat(f).st_mode & 0o004 for f in host_files)
        second = sandbox.run(parse_spec({"code": f"HOST = {host_files!r}\n{READS_COUNTERS}"}))
    finally:
        sandbox.close()
    assert first.status == Status.SUCCEEDED and second.status == Status.SUCCEEDED, (first, second)
    if kind != "docker":  # the attack's target: the host counts job A's CPU in the slot's
        assert host_files and spent >= 290, (host_files, spent)
        assert world_readable  # on the host: only the job's view stops it
    else:  # a container's group goes with it; the host's tree is still there to read
        assert list(Path("/sys/fs/cgroup").rglob("cpu.stat"))[:1]
    _, readable, listed, _ = second.steps[0].stdout.strip().split("|")  # the probe ran
    assert readable == "0", second.steps[0].stdout  # no counter in its view
    if kind != "docker":  # (a container sees only its own groups, new with it)
        assert listed == "0", second.steps[0].stdout


# Creates empty files in a directory until the filesystem refuses one; prints the count.
FILLS_INODES = """
import os
made, where = 0, {where!r}
try:
    while made < 200_000:
        os.close(os.open(f"{where}/f{{made}}", os.O_CREAT | os.O_WRONLY, 0o600))
        made += 1
    print(made, "no limit")
except OSError as exc:
    print(made, exc.strerror)
"""


def test_a_jobs_private_tmp_bounds_its_inodes(backend):
    """A job's private /tmp, /var/tmp, /dev/shm and /run (the process backend's) hold a
    bounded number of files: the kernel evicts them in the exit of the job's last
    process, and a leftover holding millions kept its slot's group busy for tens of
    seconds after its kill (an attack review: the next jobs in the slot ended `error`)."""
    kind = backend_kind(backend)
    if kind != "process":
        pytest.skip("bwrap's and docker's /tmp are in the job's workspace or container")
    sandbox = make_backend(kind, slot=SLOT)
    limits = {"workspace_mb": 16}  # workspace: max(4096, 16 * 256) inodes; each tmp: 1024
    try:
        fills = {
            where: sandbox.run(
                parse_spec({"code": FILLS_INODES.format(where=where), "limits": limits})
            )
            for where in ("/tmp", "/dev/shm", "/run", ".")
        }
    finally:
        sandbox.close()
    made = {}
    for where, result in fills.items():
        assert result.status == Status.SUCCEEDED, result
        count, reason = result.steps[0].stdout.split(" ", 1)
        made[where] = (int(count), reason.strip())
    # the control: the workspace takes its own, larger bound's worth (the attack runs)
    assert 3000 < made["."][0] < 4096, made
    for where in ("/tmp", "/dev/shm", "/run"):
        assert 500 < made[where][0] < 1024, made  # ... the private dirs a quarter of it
        assert made[where][1] == "No space left on device", made


def test_no_session_opens_beside_an_earlier_jobs_process(backend):
    """A process still in a slot's group (a leftover whose exit outlasted its job's kill)
    is killed before the slot's next session starts: never beside it, where its memory
    would count against the next job's limit and its limit could not be set."""
    kind = backend_kind(backend)
    if kind == "docker":
        pytest.skip("a container's group is new with each container")
    sandbox = make_backend(kind, slot=SLOT, prewarm=False)
    leftover, died = None, []
    try:
        first = sandbox.run(parse_spec({"command": "true"}))  # the slot's group exists
        layout = cgroups.detect()
        group = cgroups.JobCgroup(f"slot{SLOT}", layout, [b / f"slot{SLOT}" for b in layout.bases])
        leftover = subprocess.Popen(["sleep", "600"])
        for procs in group.procs_files:
            Path(procs).write_text(str(leftover.pid))
        assert leftover.pid in group.pids() and not group.none_left()  # the attack's state
        watch = threading.Thread(target=lambda: died.append((leftover.wait(), time.time())))
        watch.start()
        second = sandbox.run(parse_spec({"code": "import time; print(time.time())"}))
        watch.join(10)
    finally:
        sandbox.close()
        if leftover is not None and leftover.poll() is None:
            leftover.kill()
    assert first.status == Status.SUCCEEDED and second.status == Status.SUCCEEDED, second
    assert died and died[0][0] == -9, died  # killed ...
    assert died[0][1] < float(second.steps[0].stdout), died  # ... before the job started


SEES_SYSFS_NET = """
import os
names = sorted(os.listdir("/sys/class/net")) if os.path.isdir("/sys/class/net") else []
try:
    rx = int(open("/sys/class/net/lo/statistics/rx_bytes").read())
except OSError:
    rx = -1
print(",".join(names), rx, sep="|")
"""


def test_the_hosts_interfaces_are_out_of_a_jobs_sysfs(backend):
    """The host's sysfs lists the host's interfaces with their live counters, and the host
    loopback's carry every byte the workers exchange with Redis: a job sees its own
    network namespace's there (or no /sys), never the host's."""
    kind = backend_kind(backend)
    host = sorted(os.listdir("/sys/class/net"))
    host_rx = int(Path("/sys/class/net/lo/statistics/rx_bytes").read_text())
    assert set(host) - {"lo"} and host_rx > 0, (host, host_rx)  # there to read
    sandbox = make_backend(kind, slot=SLOT)
    try:
        result = sandbox.run(parse_spec({"code": SEES_SYSFS_NET}))
    finally:
        sandbox.close()
    assert result.status == Status.SUCCEEDED, result
    names, rx = result.steps[0].stdout.strip().split("|")
    seen = set(names.split(",")) - {""}
    assert seen <= {"lo"}, (seen, host)  # none of the host's own interfaces
    assert int(rx) < host_rx, (rx, host_rx)  # its own loopback's counters, if any

"""The docker warm pool's armed launcher (sandbox_core/backends/docker/launcher.py): a
pooled container's first step is the exec started ahead, fed its argv on the stream.
Each test first shows which path ran (``phases.prewarmed``), then that the step is
confined exactly as a cold exec's, gets its own stdin and an honest status, and that no
job reaches the launchers waiting for the slot's next jobs."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox_core import JobResult, get_backend, parse_spec, slots
from sandbox_core import defaults as d
from sandbox_core.backends.config import backend_config
from sandbox_core.backends.docker import launcher
from sandbox_core.backends.docker.backend import DockerBackend
from tests.conftest import require
from tests.security.conftest import docker_status
from tests.security.helpers import docker_client

SLOT = 201  # a fixed slot, as a worker's pool process has, out of the other tests' way
DOCKER_UID = d.DOCKER_UID_BASE + SLOT  # what its docker jobs and launchers run as
# What confines the step's process, as the kernel reports it, and what it was given.
PROBE = (
    "import os, resource; s = dict(line.split(':', 1) for line in open('/proc/self/status'));"
    " keys = ('Uid', 'Gid', 'Groups', 'NoNewPrivs', 'Seccomp', 'CapEff', 'CapBnd', 'CapPrm',"
    " 'SigIgn', 'SigBlk', 'Cpus_allowed');"
    " print(*[s[k].strip() for k in keys], sep='|');"
    " print(sorted(os.listdir('/proc/self/fd')), os.umask(0), os.getcwd());"
    " print([resource.getrlimit(r) for r in (resource.RLIMIT_NOFILE, resource.RLIMIT_NPROC,"
    " resource.RLIMIT_FSIZE, resource.RLIMIT_CPU, resource.RLIMIT_CORE, resource.RLIMIT_STACK)]);"
    " print(sorted((k, v) for k, v in os.environ.items() if k != 'HOSTNAME'));"
    " print(open('/proc/self/cgroup').read().count('docker'), sorted(os.listdir('.')));"
    " import ctypes; print(os.readlink('/proc/self/fd/0'), ctypes.CDLL(None).prctl(3, 0, 0, 0, 0))"
)
COLD = {"workspace_mb": 255}  # another profile than the pool's: a container made for the job


@pytest.fixture
def warm(is_root: bool) -> Iterator[DockerBackend]:
    ok, reason = docker_status()
    require(ok, reason)
    require(is_root, "slot uids need root")
    backend = get_backend(backend_config("docker", warm_pool=2, slot=SLOT))
    assert isinstance(backend, DockerBackend)
    assert backend.start_pool(wait_s=120), "the warm pool did not fill"
    yield backend
    backend.close()


def run(backend: DockerBackend, spec: dict[str, object], *, fill: bool = True) -> JobResult:
    if fill:
        assert backend.start_pool(wait_s=120)
    return backend.run(parse_spec(spec))


def processes_of(uid: int) -> dict[int, list[bytes]]:
    """Host pids running as ``uid`` (real uid: a launcher is not dumpable, so its /proc
    entry belongs to root), with their argv."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        real = next(line.split()[1] for line in status.splitlines() if line.startswith("Uid:"))
        if int(real) == uid and "State:\tZ" not in status:
            found[int(entry.name)] = cmdline
    return found


def launchers_of(uid: int) -> dict[int, list[bytes]]:
    """The launchers waiting as ``uid`` (in any container)."""
    armed = [b"python3", b"-I", b"-S", b"-c"]
    return {pid: argv for pid, argv in processes_of(uid).items() if argv[:4] == armed}


def test_a_warm_first_step_is_confined_as_a_cold_one(warm: DockerBackend) -> None:
    warm_job = run(warm, {"code": PROBE})
    cold_job = run(warm, {"code": PROBE, "limits": COLD})
    assert warm_job.status.value == cold_job.status.value == "succeeded", (warm_job, cold_job)
    assert warm_job.timings.phases.prewarmed is True  # through the armed launcher
    assert cold_job.timings.phases.prewarmed is False  # a plain docker exec
    lines = warm_job.steps[0].stdout.splitlines()
    uids = "\t".join([str(DOCKER_UID)] * 4)  # real, effective, saved, fs: the slot's
    assert lines[0].startswith(f"{uids}|"), lines[0]
    assert "|1|2|0000000000000000|" in lines[0], lines[0]  # no_new_privs, filter, no caps
    assert lines[-1] == "/dev/null 1", lines[-1]  # no stdin: /dev/null; dumpable again
    assert warm_job.steps[0].stdout == cold_job.steps[0].stdout


def test_a_second_step_and_file_helpers_run_as_before(warm: DockerBackend) -> None:
    spec = {
        "files": {"in.txt": "seeded\n"},
        "steps": [
            {"kind": "bash", "command": "cat in.txt; echo made > out.txt"},
            {"kind": "bash", "command": "cat out.txt"},
        ],
        "collect": ["out.txt"],
    }
    result = run(warm, spec)
    assert result.status.value == "succeeded", result
    assert result.timings.phases.prewarmed is True
    assert [s.stdout for s in result.steps] == ["seeded\n", "made\n"]
    assert [f.path for f in result.files] == ["out.txt"]


def test_a_warm_step_gets_its_stdin_and_an_honest_status(warm: DockerBackend) -> None:
    read = "import sys; print(repr(sys.stdin.read()))"
    fed = run(warm, {"steps": [{"kind": "python", "code": read, "stdin": "a\nb"}]})
    assert fed.timings.phases.prewarmed is True
    assert fed.steps[0].stdout == "'a\\nb'\n"  # all of it, then EOF
    unfed = run(warm, {"code": read})
    assert unfed.timings.phases.prewarmed is True and unfed.steps[0].stdout == "''\n"
    failed = run(warm, {"code": "import sys; sys.exit(3)"})
    assert failed.timings.phases.prewarmed is True
    assert (failed.status.value, failed.steps[0].exit_code) == ("failed", 3)
    killed = run(warm, {"code": "import os; os.kill(os.getpid(), 9)"})
    assert killed.timings.phases.prewarmed is True
    assert (killed.steps[0].exit_code, killed.steps[0].signal) == (None, 9)
    piped = run(warm, {"command": 'yes | head -c 3; echo " ${PIPESTATUS[0]}"'})
    assert piped.timings.phases.prewarmed is True
    assert piped.steps[0].stdout == "y\ny 141\n"  # SIGPIPE is the default again, as cold


def test_a_job_cannot_reach_the_launchers_waiting_for_the_next_jobs(warm: DockerBackend) -> None:
    waiting = launchers_of(DOCKER_UID)
    assert waiting, "no launcher waits in the pool: the attack has no target"
    # The attacker kills every process its uid may signal, and lists every process it
    # can see; its own sleeper shows the kill ran.
    attack = run(
        warm,
        {
            "command": "sleep 30 & kill -9 -1; wait $!; echo killed=$?;"
            " ls /proc | grep -c '^[0-9]'",
        },
    )
    assert attack.timings.phases.prewarmed is True
    killed, visible = attack.steps[0].stdout.split()
    assert killed == "killed=137"  # the attack ran: its own sleeper died of it
    assert int(visible) <= 5  # tini, keeper, bash, ls, grep: its own container only
    alive = launchers_of(DOCKER_UID)
    # the attack's own container's launcher became its step; every other one still waits
    assert len(waiting) >= 2 and len(set(waiting) & set(alive)) == len(waiting) - 1
    victim = run(warm, {"command": "echo unharmed"}, fill=False)
    assert victim.timings.phases.prewarmed is True and victim.steps[0].stdout == "unharmed\n"


def test_the_processes_limit_is_the_same_warm_and_cold(warm: DockerBackend) -> None:
    # Forks until the kernel refuses: the armed launchers of the slot's other pooled
    # containers share the job's uid, and must not eat its processes limit.
    fork = (
        "import os, time\nn = 0\ntry:\n    while n < 500:\n        if os.fork() == 0:\n"
        "            time.sleep(30)\n            os._exit(0)\n        n += 1\n"
        "except OSError:\n    pass\nprint(n)\n"
    )
    warm_job = run(warm, {"code": fork})
    cold_job = run(warm, {"code": fork, "limits": COLD})
    assert warm_job.timings.phases.prewarmed is True
    assert cold_job.timings.phases.prewarmed is False
    limit = parse_spec({"code": "pass"}).limits.processes
    assert 0 < int(cold_job.steps[0].stdout) < 500  # the limit stopped the bomb
    # exactly `processes` of the job's own, its first one included, warm or cold
    assert int(warm_job.steps[0].stdout) == int(cold_job.steps[0].stdout) == limit - 1


def test_a_launcher_that_did_not_come_up_leaves_the_step_to_a_plain_exec(
    is_root: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    ok, reason = docker_status()
    require(ok, reason)
    require(is_root, "slot uids need root")
    monkeypatch.setattr(launcher, "SOURCE", "import os; os._exit(0)")  # never ready
    backend = get_backend(backend_config("docker", warm_pool=1, slot=SLOT))
    assert isinstance(backend, DockerBackend)
    try:
        assert backend.start_pool(wait_s=120)
        result = run(backend, {"command": "echo by-exec"})
        assert result.status.value == "succeeded", result
        assert result.timings.phases.prewarmed is False and result.steps[0].stdout == "by-exec\n"
    finally:
        backend.close()


def test_closing_the_backend_leaves_no_launcher_or_container(warm: DockerBackend) -> None:
    assert launchers_of(DOCKER_UID), "no launcher was armed: nothing to leave behind"
    warm.close()
    deadline = time.monotonic() + 10
    while launchers_of(DOCKER_UID) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert launchers_of(DOCKER_UID) == {}
    mine = {"label": ["sandfarm.managed=1", f"sandfarm.pid={os.getpid()}"]}
    assert docker_client().api.containers(all=True, filters=mine) == []


def test_a_host_job_in_the_slot_cannot_reach_its_docker_launchers(warm: DockerBackend) -> None:
    # A process-backend job of the same slot (a worker's pool process serves every
    # backend in one slot) looks for the launchers on the host, would feed one its own
    # step through /proc/<pid>/fd/0, and kills every process its uid may signal.
    waiting = launchers_of(DOCKER_UID)
    assert waiting, "no launcher waits in the pool: the attack has no target"
    attack = (
        "import os, signal, subprocess, json\n"
        "sleeper = subprocess.Popen(['sleep', '30'])\n"
        "found = fed = 0\n"
        "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
        "    try:\n"
        "        argv = open(f'/proc/{pid}/cmdline', 'rb').read().split(b'\\0')\n"
        "    except OSError:\n"
        "        continue\n"
        "    if argv[:4] == [b'python3', b'-I', b'-S', b'-c']:\n"
        "        found += 1\n"
        "        try:\n"
        "            msg = json.dumps({'argv': ['echo', 'HIJACKED'], 'env': {}, 'stdin': False})\n"
        "            with open(f'/proc/{pid}/fd/0', 'wb') as fd0:\n"
        "                fd0.write(len(msg).to_bytes(8, 'big') + msg.encode())\n"
        "            fed += 1\n"
        "        except OSError:\n"
        "            pass\n"
        "os.kill(-1, signal.SIGKILL)  # all its uid may signal, but itself\n"
        "print(os.getuid(), found, fed, sleeper.wait())\n"
    )
    local = get_backend(backend_config("process", slot=SLOT))
    try:
        result = local.run(parse_spec({"code": attack}))
    finally:
        local.close()
    assert result.status.value == "succeeded", result
    uid, found, fed, sleeper = result.steps[0].stdout.split()
    assert int(sleeper) == -9  # the attack ran: its own sleeper died of its kill
    assert int(uid) == slots.slot_uid(SLOT) != DOCKER_UID  # the slot's host uid, not docker's
    assert (found, fed) == ("0", "0")  # it saw no launcher, fed none
    assert set(waiting) <= set(launchers_of(DOCKER_UID))  # every one still waits
    victim = run(warm, {"command": "echo unharmed"}, fill=False)
    assert victim.timings.phases.prewarmed is True and victim.steps[0].stdout == "unharmed\n"


def test_a_launcher_that_died_waiting_leaves_the_step_to_a_plain_exec(
    is_root: bool,
) -> None:
    ok, reason = docker_status()
    require(ok, reason)
    require(is_root, "slot uids need root")
    backend = get_backend(backend_config("docker", warm_pool=1, slot=SLOT))
    assert isinstance(backend, DockerBackend)
    try:
        assert backend.start_pool(wait_s=120)
        (pid,) = launchers_of(DOCKER_UID)
        os.kill(pid, 9)  # only root can: no job shares its uid and pid namespace
        deadline = time.monotonic() + 5
        while pid in launchers_of(DOCKER_UID) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert pid not in launchers_of(DOCKER_UID)  # it died before its job came
        result = run(backend, {"command": "echo ran-once"}, fill=False)
        assert result.status.value == "succeeded", result  # not blamed on the job
        assert result.timings.phases.prewarmed is False and result.steps[0].stdout == "ran-once\n"
    finally:
        backend.close()


@pytest.mark.parametrize("limits", [{}, COLD], ids=["warm", "cold"])
def test_stdin_the_step_never_reads_cannot_hold_the_worker_past_the_deadline(
    warm: DockerBackend, limits: dict[str, int]
) -> None:
    spec = {
        "steps": [{"kind": "python", "code": "import time; time.sleep(60)", "stdin": "x" * 2**20}],
        "limits": {"timeout_s": 3, **limits},
    }
    assert warm.start_pool(wait_s=120)
    started = time.monotonic()
    result = warm.run(parse_spec(spec))
    elapsed = time.monotonic() - started
    assert result.timings.phases.prewarmed is (limits == {})
    assert result.status.value == "timed_out", result  # the step ran, and never read it
    assert elapsed < 3 + 20, elapsed  # the deadline, docker's kill and removal; never 60 s


def test_a_jobs_leftovers_are_gone_before_its_slot_is_released(warm: DockerBackend) -> None:
    left = run(
        warm,
        {
            "command": "for i in 1 2 3 4 5; do setsid sleep 60 </dev/null >/dev/null 2>&1 & done;"
            " sleep 0.2; grep -lx sleep /proc/[0-9]*/comm 2>/dev/null | wc -l"
        },
    )
    assert left.timings.phases.prewarmed is True
    assert left.steps[0].stdout.strip() == "6"  # the leftovers ran (and the keeper sleeps)
    # none of them runs as the slot's docker uid once the job's result is back
    leftovers = [
        argv for argv in processes_of(DOCKER_UID).values() if argv[:2] == [b"sleep", b"60"]
    ]
    assert leftovers == []


@pytest.mark.parametrize("limits", [{}, COLD], ids=["warm", "cold"])
def test_a_step_that_writes_before_it_reads_its_stdin_does_not_deadlock(
    warm: DockerBackend, limits: dict[str, int]
) -> None:
    code = (
        "import sys; sys.stdout.write('x' * (4 << 20)); sys.stdout.flush();"
        " print(len(sys.stdin.read()))"
    )
    spec = {
        "steps": [{"kind": "python", "code": code, "stdin": "y" * 2**20}],
        "limits": {"timeout_s": 20, **limits},
    }
    result = run(warm, spec)
    assert result.timings.phases.prewarmed is (limits == {})
    assert result.status.value == "succeeded", result.message  # fed while it wrote
    assert result.steps[0].stdout.endswith("1048576\n")  # all of its stdin, then EOF

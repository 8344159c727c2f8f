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
from sandbox_core.backends.config import backend_config
from sandbox_core.backends.docker import launcher
from sandbox_core.backends.docker.backend import DockerBackend
from tests.conftest import require
from tests.security.conftest import docker_status
from tests.security.helpers import docker_client

SLOT = 201  # a fixed slot, as a worker's pool process has, out of the other tests' way
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
    " print(open('/proc/self/cgroup').read().count('docker'), sorted(os.listdir('.')))"
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


def launchers_of(uid: int) -> dict[int, str]:
    """Host pids of the launchers waiting as ``uid`` (any container), with their cmdline."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            owner = entry.stat().st_uid
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if owner == uid and cmdline[:4] == [b"python3", b"-I", b"-S", b"-c"]:
            found[int(entry.name)] = cmdline[4].decode(errors="replace")[:40]
    return found


def test_a_warm_first_step_is_confined_as_a_cold_one(warm: DockerBackend) -> None:
    warm_job = run(warm, {"code": PROBE})
    cold_job = run(warm, {"code": PROBE, "limits": COLD})
    assert warm_job.status.value == cold_job.status.value == "succeeded", (warm_job, cold_job)
    assert warm_job.timings.phases.prewarmed is True  # through the armed launcher
    assert cold_job.timings.phases.prewarmed is False  # a plain docker exec
    lines = warm_job.steps[0].stdout.splitlines()
    uid = slots.slot_uid(SLOT)
    assert lines[0].startswith(f"{uid}\t{uid}\t{uid}\t{uid}|"), lines[0]  # the slot's uid
    assert "|1|2|0000000000000000|" in lines[0], lines[0]  # no_new_privs, filter, no caps
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
    uid = slots.slot_uid(SLOT)
    assert uid is not None
    waiting = launchers_of(uid)
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
    alive = launchers_of(uid)
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
    uid = slots.slot_uid(SLOT)
    assert uid is not None
    assert launchers_of(uid), "no launcher was armed: nothing to leave behind"
    warm.close()
    deadline = time.monotonic() + 10
    while launchers_of(uid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert launchers_of(uid) == {}
    mine = {"label": ["sandfarm.managed=1", f"sandfarm.pid={os.getpid()}"]}
    assert docker_client().api.containers(all=True, filters=mine) == []

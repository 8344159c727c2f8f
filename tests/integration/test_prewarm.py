"""Prewarm: the next job's sandbox is set up before the job arrives and waits for it
(sandfarm-exec --standby). Each test first shows which path ran (``phases.prewarmed``),
then that a job in a standby sees exactly what a cold one sees, gets its own limits and
environment, and that nothing of an earlier job, or of another backend sharing the slot,
reaches it."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator

import pytest

from sandbox_core import Backend, JobResult, get_backend, parse_spec, slots
from sandbox_core.backends import prewarm
from sandbox_core.backends.config import backend_config
from sandbox_core.backends.local import LocalBackend
from tests.conftest import require

# What confines the job's own process, as the kernel reports it, and what it was given.
PROBE = (
    "import os, resource; s = dict(line.split(':', 1) for line in open('/proc/self/status'));"
    " keys = ('Uid', 'Gid', 'Groups', 'NoNewPrivs', 'Seccomp', 'CapEff', 'CapBnd');"
    " print(*[s[k].strip() for k in keys], sep='|');"
    " print(sorted(os.listdir('/proc/self/fd')));"
    " print(open('/proc/self/cgroup').read().count('sandfarm'));"
    " print([resource.getrlimit(r) for r in (resource.RLIMIT_NOFILE, resource.RLIMIT_NPROC,"
    " resource.RLIMIT_FSIZE, resource.RLIMIT_CPU, resource.RLIMIT_CORE)]);"
    " print(sorted(k for k in os.environ), os.getcwd() == os.environ['HOME']);"
    " print(sorted(os.listdir(os.environ['TMPDIR'])), sorted(os.listdir('.')));"
    " print(len([m for m in open('/proc/self/mountinfo') if 'sandfarm/work' in m]))"
)
SLOT = 200  # a fixed slot, as a worker's pool process has, out of the other tests' way


def make(name: str, **options: object) -> LocalBackend:
    backend = get_backend(backend_config(name, **options))
    assert isinstance(backend, LocalBackend)
    return backend


@pytest.fixture(params=["process", "bwrap"])
def name(request: pytest.FixtureRequest, is_root: bool) -> str:
    require(is_root, "a standby needs root (slot uids, cgroups, the exec helper as root)")
    if request.param == "bwrap":
        require(shutil.which("bwrap") is not None, "bubblewrap is not installed")
    backend = make(request.param)
    try:
        require(backend.prewarms, "no exec helper built (make setup)")
    finally:
        backend.close()
    return str(request.param)


@pytest.fixture
def warm(name: str) -> Iterator[LocalBackend]:
    backend = make(name, slot=SLOT)
    yield backend
    backend.close()


def run(backend: Backend, command: str, **spec: object) -> JobResult:
    result = backend.run(parse_spec({"command": command, **spec}))
    assert result.status.value == "succeeded", result
    return result


def standby_of(backend: LocalBackend) -> prewarm.Standby:
    """The standby waiting in the backend's slot (made after its last job)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        session = prewarm._ready.get(prewarm._key(backend))
        if session is not None and session.standby is not None:
            return session.standby
        time.sleep(0.01)
    raise AssertionError("no standby was made")


def test_a_warm_job_is_confined_as_a_cold_one(warm: LocalBackend, name: str) -> None:
    run(warm, "true")  # cold: the standby for the next job is made after it
    warm_job = run(warm, f'python3 -c "{PROBE}"', env={"ANSWER": "42"})
    assert warm_job.timings.phases.prewarmed is True
    warm.close()  # the slot is the cold backend's now
    cold = make(name, slot=SLOT, prewarm=False)
    try:
        cold_job = run(cold, f'python3 -c "{PROBE}"', env={"ANSWER": "42"})
    finally:
        cold.close()
    assert cold_job.timings.phases.prewarmed is False
    # same uid, no_new_privs, filter, caps, fds, cgroups, rlimits, environment, an empty
    # workspace and tmp, and no other job's workspace among its mounts
    assert warm_job.steps[0].stdout == cold_job.steps[0].stdout
    uid, _, _, nnp, seccomp, cap_eff, _ = warm_job.steps[0].stdout.split("|", 6)
    assert not uid.startswith("0") and nnp == "1" and seccomp == "2" and int(cap_eff, 16) == 0


def test_a_warm_job_gets_its_own_limits_and_environment(warm: LocalBackend) -> None:
    run(warm, "true", env={"EARLIER_SECRET": "s3cret"}, limits={"open_files": 100})
    later = run(
        warm,
        'echo "$(ulimit -n) $(ulimit -u) ${EARLIER_SECRET:-none} $MINE"; cat /proc/self/environ',
        env={"MINE": "mine"},
        limits={"open_files": 200, "processes": 20},
    )
    assert later.timings.phases.prewarmed is True
    first_line, environ = later.steps[0].stdout.split("\n", 1)
    # RLIMIT_NPROC counts the wrapper's own processes too (bwrap: 2), as in a cold start
    assert first_line == f"200 {20 + warm.helper_processes} none mine"
    assert "s3cret" not in environ and "EARLIER_SECRET" not in environ


def test_another_shape_runs_cold_and_a_stdin_reaches_a_warm_job(warm: LocalBackend) -> None:
    run(warm, "true")
    standby_of(warm)  # one is waiting, of the default shape
    other_size = run(warm, "df -m . | tail -1", limits={"workspace_mb": 32})
    assert other_size.timings.phases.prewarmed is False
    assert " 32 " in other_size.steps[0].stdout  # its own workspace size, not the standby's
    standby_of(warm)  # made again, of the default shape (never of another job's)
    step = {"kind": "bash", "command": "cat; cat", "stdin": "fed\n"}
    with_stdin = warm.run(parse_spec({"steps": [step]}))
    assert with_stdin.timings.phases.prewarmed is True  # its stdin reaches it, then EOF
    assert with_stdin.steps[0].stdout == "fed\n", with_stdin


def test_a_dead_standby_means_a_cold_start(warm: LocalBackend) -> None:
    run(warm, "true")
    standby = standby_of(warm)
    assert standby.alive()
    os.kill(standby.proc.pid, 9)
    deadline = time.monotonic() + 5
    while standby.alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not standby.alive()  # dead before its job came (left as a zombie to reap)
    result = run(warm, "echo fine")
    assert result.timings.phases.prewarmed is False and result.steps[0].stdout == "fine\n"


def test_an_earlier_jobs_daemon_cannot_reach_the_next_jobs_sandbox(warm: LocalBackend) -> None:
    # The attacker leaves a daemon of its slot's uid that, once its own job is over, would
    # kill every process of that uid: a standby made while it lived would die.
    attack = run(
        warm,
        "setsid sh -c 'sleep 0.3; while :; do kill -9 -1; done' </dev/null >/dev/null 2>&1 &"
        " echo $!; sleep 0.1; kill -0 $! && echo alive",
    )
    _pid, alive = attack.steps[0].stdout.split()
    assert alive == "alive"  # the daemon ran
    time.sleep(0.5)  # it would be killing by now
    standby = standby_of(warm)
    assert standby.alive()
    victim = run(warm, "echo unharmed")
    assert victim.timings.phases.prewarmed is True and victim.steps[0].stdout == "unharmed\n"
    uid = slots.slot_uid(SLOT)
    assert uid is not None
    assert "sh" not in commands_of(uid)  # the daemon died with its job


def commands_of(uid: int) -> list[str]:
    """The command names of the host's processes running as ``uid``."""
    names = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and os.stat(f"/proc/{entry}").st_uid == uid:
                with open(f"/proc/{entry}/comm") as comm:
                    names.append(comm.read().strip())
        except OSError:
            continue
    return names


def test_backends_sharing_a_slot_never_meet_in_it(is_root: bool) -> None:
    require(is_root, "a standby needs root")
    require(shutil.which("bwrap") is not None, "bubblewrap is not installed")
    process, bwrap = make("process", slot=SLOT), make("bwrap", slot=SLOT)
    try:
        require(process.prewarms and bwrap.prewarms, "no exec helper built (make setup)")
        # every process of the slot's uid, as a process job sees them (its /proc shows
        # its own uid's): a bwrap standby left in the slot would be among them
        listing = "cat /proc/[0-9]*/comm"
        run(bwrap, "true")
        standby_of(bwrap)
        seen = run(process, listing)
        assert seen.timings.phases.prewarmed is False  # the bwrap standby was closed first
        assert not {"bwrap", "sandfarm-exec"} & set(seen.steps[0].stdout.split()), seen
        standby_of(process)
        in_bwrap = run(bwrap, "echo bwrap")
        assert in_bwrap.timings.phases.prewarmed is False and in_bwrap.steps[0].stdout == "bwrap\n"
        again = run(bwrap, "echo again")
        assert again.timings.phases.prewarmed is True
    finally:
        process.close()
        bwrap.close()


def test_closing_the_backend_removes_its_standby(warm: LocalBackend) -> None:
    run(warm, "true")
    standby = standby_of(warm)
    session = prewarm._ready[prewarm._key(warm)]
    root = session.ws.root
    assert root.is_dir() and standby.alive()
    warm.close()
    assert not root.exists()
    with pytest.raises(ProcessLookupError):
        os.kill(standby.proc.pid, 0)


def test_an_unfinished_job_message_runs_nothing(tmp_path: os.PathLike[str], is_root: bool) -> None:
    helper = make("process").exec_helper
    require(helper is not None, "no exec helper built (make setup)")
    assert helper is not None
    marker = os.path.join(tmp_path, "ran")
    for message in (f"D0\0A/usr/bin/touch\0A{marker}\0".encode(), b""):  # no "." at the end
        go_r, go_w = os.pipe()
        os.set_inheritable(go_r, True)
        pid = os.posix_spawn(helper, [helper, "--standby", str(go_r), "--"], {}, file_actions=[])
        os.close(go_r)
        os.write(go_w, message)
        os.close(go_w)
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
        assert not os.path.exists(marker)
    go_r, go_w = os.pipe()  # the control: the same job, finished, runs
    os.set_inheritable(go_r, True)
    pid = os.posix_spawn(helper, [helper, "--standby", str(go_r), "--"], {}, file_actions=[])
    os.close(go_r)
    os.write(go_w, f"D0\0A/usr/bin/touch\0A{marker}\0.\0".encode())
    os.close(go_w)
    os.waitpid(pid, 0)
    assert os.path.exists(marker)


def test_rlimits_only_lower_than_the_workers_use_a_standby() -> None:
    import resource

    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert prewarm.lowers_only([(resource.RLIMIT_NOFILE, 10, 10)])
    if hard != resource.RLIM_INFINITY:
        assert not prewarm.lowers_only([(resource.RLIMIT_NOFILE, hard + 1, hard + 1)])
        assert not prewarm.lowers_only([(resource.RLIMIT_NOFILE, 1, resource.RLIM_INFINITY)])


def test_with_a_spare_slot_the_next_sandbox_waits_out_of_the_running_jobs_reach(
    name: str,
) -> None:
    """A worker's pool process has a spare slot: while a job runs in one slot, the next
    job's standby waits in the other, under the other slot's uid. The running job is
    handed the standby's pid and tries to signal it and read its /proc: it cannot, and
    the next job runs in that standby, unharmed."""
    import threading

    spare = SLOT + 1
    backend = make(name, slot=SLOT, spare_slot=spare)
    try:
        run(backend, "true")  # cold; the standby for the next job is made after it
        standby_of(backend)
        outcome: dict[str, JobResult] = {}
        probe = (
            "while [ ! -s pid ]; do sleep 0.01; done; p=$(cat pid);"
            " kill -0 $p 2>/dev/null && echo signalled || echo refused;"
            " cat /proc/$p/environ >/dev/null 2>&1 && echo read || echo unread; id -u"
        )
        job = threading.Thread(target=lambda: outcome.update(job=run(backend, probe)))
        job.start()
        try:
            # The job took the standby; the next one is made in the other slot meanwhile.
            deadline = time.monotonic() + 10
            other = None
            while other is None and time.monotonic() < deadline:
                for index in (SLOT, spare):
                    session = prewarm._ready.get(("slot", index))
                    if session is not None and session.standby is not None:
                        other = session
                time.sleep(0.01)
            assert other is not None, "no standby in the other slot while the job ran"
            standby = other.standby
            assert standby is not None and standby.alive()  # the target is there
            running_in = spare if other.slot.index == SLOT else SLOT
            work = list((slots.workspace_base() / f"slot-{running_in}").glob("*/work"))
            assert len(work) == 1, work
            (work[0] / "pid").write_text(str(standby.proc.pid))
        finally:
            job.join(30)
        attack = outcome["job"]
        refused, unread, uid = attack.steps[0].stdout.split()
        assert (refused, unread) == ("refused", "unread"), attack.steps[0].stdout
        assert int(uid) == slots.slot_uid(running_in)
        assert int(uid) != slots.slot_uid(other.slot.index)  # the two slots' uids differ
        assert standby.alive()  # unharmed, and the next job runs in it
        victim = run(backend, "id -u")
        assert victim.timings.phases.prewarmed is True
        assert int(victim.steps[0].stdout) == slots.slot_uid(other.slot.index)
    finally:
        backend.close()

"""A local backend's session: a host workspace in a slot, the slot's cgroup, and each
step started (cold, or in the standby prewarm made for it) and supervised."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from sandbox_core import defaults as d
from sandbox_core import slots
from sandbox_core.backends import prewarm
from sandbox_core.backends.base import Session
from sandbox_core.backends.steps import direct_words, script_argv, source_of
from sandbox_core.cgroups import TCP_USAGE_V1, JobCgroup, tcp_buffers_limit
from sandbox_core.childsetup import ChildSetup, bytes_memfd, env_memfd
from sandbox_core.errors import SlotBusyError
from sandbox_core.models import CollectedFile, ExecStep, JobSpec, PythonStep
from sandbox_core.output import HeadTailBuffer
from sandbox_core.runner import (
    ExecOutcome,
    apply_init_record,
    run_captured,
    start_process,
    supervise,
)
from sandbox_core.sweep import end_sockets, reap_zombies_of, sweep_uid
from sandbox_core.tcpwatch import TcpWatch, listeners_here, listeners_in_namespace
from sandbox_core.workspace import Workspace

if TYPE_CHECKING:
    from sandbox_core.backends.local import LocalBackend


@dataclass(frozen=True)
class Launch:
    """The program to exec, the environment it gets, fds it inherits (closed after), and
    the read end of the pipe our init writes the job's real wait status to, if any."""

    argv: list[str]
    env: dict[str, str]
    fds: list[int] = field(default_factory=list)
    status_fd: int | None = None
    direct: int = 0  # argv starts with this many words the helper may exec without bash
    waits: bool = False  # a standby: argv itself waits for the job (bwrap's init)


@dataclass(frozen=True)
class StepPlan:
    """One exec step, ready to start: in a standby or cold."""

    step: ExecStep
    command: list[str]  # argv: ``direct`` simple-command words, then the script's argv
    env: dict[str, str]
    direct: int
    setup: ChildSetup
    deadline: float
    cancel: threading.Event | None
    watch: TcpWatch | None = None

    @property
    def stdin(self) -> bytes | None:
        return self.step.stdin.encode() if self.step.stdin else None


@dataclass(frozen=True)
class SandboxPaths:
    """Where the workspace, its tmp and the step scripts appear to the job."""

    work: str
    tmp: str
    scripts: str


class LocalSession(Session):
    def __init__(self, backend: LocalBackend, spec: JobSpec, slot: slots.Slot) -> None:
        self.backend = backend
        self.spec = spec
        self.slot = slot
        self.cgroup: JobCgroup | None = None
        self.clean = True  # no process of this session can be alive
        self.prewarmed = False
        self.standby: prewarm.Standby | None = None  # its first step's helper, waiting
        self.ws = Workspace.create(
            slot.workspace_dir(backend.workspace_dir),
            spec.limits.workspace_mb,
            slot.uid,
            slot.gid,
        )
        try:
            self.scripts = self.ws.root / "scripts"
            self.scripts.mkdir(mode=0o755)  # root-owned when root: the job reads, never edits
            self.cgroup = slot.cgroup
            self._wait_for_empty_group()
            self.apply_limits()
        except BaseException:
            self.close()
            raise
        self.paths = backend.sandbox_paths(self)

    def _wait_for_empty_group(self) -> None:
        """Never a session beside an earlier job's process: its memory would count against
        this job's limit (defaults.SLOT_KILL_WAIT_S)."""
        group = self.cgroup
        if group is not None and not group.none_left() and not group.kill(d.SLOT_KILL_WAIT_S):
            raise SlotBusyError(self.slot.index, d.SLOT_KILL_WAIT_S)

    def apply_limits(self) -> None:
        if self.cgroup is not None:
            self.cgroup.set_limits(
                memory_bytes=self.spec.limits.memory_mb * d.MIB,
                pids_max=self.spec.limits.processes + self.backend.helper_processes,
                cpus=self.spec.limits.cpus,
            )

    # A standby (see prewarm): the first step's sandbox, made before the job is known.
    def start_standby(self) -> bool:
        """Start the first step's helper, set up and waiting; False where it cannot be."""
        helper = self.backend.exec_helper
        if helper is None:
            return False
        setup = self.backend.child_setup(self)
        go_r, go_w = os.pipe2(os.O_CLOEXEC)
        launch = None
        try:
            launch = self.backend.standby_launch(self, go_r)
        finally:
            if launch is None:
                os.close(go_r)
                os.close(go_w)
        if launch is None:
            return False
        owned = [go_r, *(fd for fd in launch.fds if fd != go_r)]
        proc = None
        try:
            seccomp_fd = bytes_memfd("sandfarm-seccomp", setup.seccomp) if setup.seccomp else None
            owned += [seccomp_fd] if seccomp_fd is not None else []
            waits_in_helper = None if launch.waits else go_r
            prefix = setup.helper_argv(
                helper, None, seccomp_fd, standby_fd=waits_in_helper, job_later=True
            )
            if prefix is not None:
                netns = [setup.netns_fd] if setup.netns_fd is not None else []
                self.clean = False
                proc = start_process(
                    [*prefix, *launch.argv],
                    env={},
                    cwd=str(self.ws.work),
                    stdin=True,  # the job's stdin, or EOF at once, as a cold step's
                    pass_fds=owned + netns,
                )
        finally:
            for fd in owned:
                os.close(fd)
            if proc is None:
                os.close(go_w)
                if launch.status_fd is not None:
                    os.close(launch.status_fd)
        if proc is None:
            return False
        self.standby = prewarm.Standby(proc, go_w, launch.status_fd)
        return True

    def waiting(self) -> bool:
        return self.standby is not None and self.standby.alive()

    def adopt(self, spec: JobSpec) -> None:
        """Run ``spec`` here (a job of the shape this session was made for)."""
        self.spec = spec
        self.apply_limits()

    # files: every job process is dead between steps (a standby only waits on its pipe),
    # so the guard cannot be raced
    def write_file(self, path: str, content: bytes) -> None:
        self.ws.write_file(path, content)

    def read_into(self, path: str, buffer: HeadTailBuffer) -> None:
        self.ws.read_into(path, buffer)

    def collect(self, patterns: list[str]) -> tuple[list[CollectedFile], int]:
        return self.ws.collect(patterns)

    def kill_tree(self) -> None:
        if self.cgroup is not None:
            self.cgroup.kill(d.SLOT_KILL_WAIT_S)  # the job's own time (defaults)
        elif self.slot.uid is not None:
            sweep_uid(self.slot.uid)

    def exec(
        self, step: ExecStep, index: int, deadline: float, cancel: threading.Event | None
    ) -> ExecOutcome:
        write_script(self.scripts / f"step-{index}", source_of(step), self.slot.gid)
        argv = script_argv(step, self.backend.python, f"{self.paths.scripts}/step-{index}")
        ooms_before = self.cgroup.oom_kills_before() if self.cgroup else 0
        cpu_before = self.cgroup.cpu_ns() if self.cgroup else 0
        self.clean = False
        setup = self.backend.child_setup(self)
        env = self.backend.environment(self)
        words: list[str] = []
        if not isinstance(step, PythonStep) and self.backend.runs_direct(setup):
            words = direct_words(step.command, env) or []  # the script stays as the fallback
        status_fd: int | None = None
        try:
            watch = self._tcp_watch(setup)
            plan = StepPlan(step, [*words, *argv], env, len(words), setup, deadline, cancel, watch)
            ran = self._run_standby(plan)
            if ran is None:
                ran = self._run_cold(plan)
            outcome, status_fd = ran
        finally:
            self.kill_tree()  # nothing a step started outlives it, daemon or not
            self.clean = True
            if self.slot.uid is not None:
                reap_zombies_of(self.slot.uid)
                if _in_host_network(setup):
                    end_sockets(self.slot.uid, deadline)  # they die with it there too
            record = _read_all(status_fd) if status_fd is not None else None
        if record:
            # Our init's word on the job (else it was killed with the sandbox on a
            # timeout, flood or cancel, or never started: the sandbox's own exit stands).
            apply_init_record(outcome, record)
        if self.cgroup is not None:
            outcome.memory_exceeded = self.cgroup.oom_kills() > ooms_before
            # killed short of its own limit: the farm's bound for all jobs together was hit
            outcome.farm_memory_bound = (
                outcome.memory_exceeded and not self.cgroup.reached_own_limit()
            )
            outcome.cpu_ms = max(outcome.cpu_ms, (self.cgroup.cpu_ns() - cpu_before) / 1e6)
        return outcome

    def _tcp_watch(self, setup: ChildSetup) -> TcpWatch | None:
        """The step's watch on TCP memory the kernel lets it hold past its bound (why:
        tcpwatch.py): its slot group's v1 TCP charge, and its listeners by the slot's uid
        (not where the job has no uid of its own, or runs in a namespace the sandbox makes
        itself, without root: not ours to join)."""
        uid, found = self.slot.uid, None
        if setup.netns_fd is not None:
            netns_fd = setup.netns_fd
            found = lambda: listeners_in_namespace(netns_fd)  # noqa: E731
        elif _in_host_network(setup) and uid is not None:
            found = listeners_here  # a network job: the host's namespace, told by its uid
        usage = self._tcp_usage()
        if usage is None and found is None:
            return None
        bound = tcp_buffers_limit(self.spec.limits.memory_mb * d.MIB)
        own = setup.netns_fd is not None
        return TcpWatch(uid, found, usage or (lambda: None), bound, own_namespace=own)

    def _tcp_usage(self) -> Callable[[], int | None] | None:
        """The slot group's v1 TCP charge, read through the group's open files."""
        cgroup = self.cgroup
        if cgroup is None or cgroup.layout.memory is None or cgroup.layout.memory_v2:
            return None
        path = cgroup.layout.memory / cgroup.name / TCP_USAGE_V1

        def read() -> int | None:
            try:
                return int(cgroup.files.read(path))
            except (OSError, ValueError):
                return None

        return read

    def _run_standby(self, plan: StepPlan) -> tuple[ExecOutcome, int | None] | None:
        """The step in this session's standby (the first step only), or None: run cold."""
        standby, self.standby = self.standby, None
        if standby is None:
            return None
        rlimits = plan.setup.rlimits
        if prewarm.lowers_only(rlimits):  # its uid can only lower them
            started = time.monotonic()
            if standby.go(plan.command, plan.env, plan.direct, rlimits):
                self.prewarmed = True
                try:
                    outcome = supervise(
                        standby.proc,
                        started,
                        self.spec.limits,
                        plan.deadline,
                        self.kill_tree,
                        plan.stdin,
                        plan.cancel,
                        plan.watch,
                    )
                except BaseException:
                    standby.discard()
                    raise
                return outcome, standby.status_fd
        self.kill_tree()
        standby.discard()
        return None

    def _run_cold(self, plan: StepPlan) -> tuple[ExecOutcome, int | None]:
        """The step in a sandbox set up now."""
        setup = plan.setup
        launch = self.backend.wrap(self, plan.command, plan.env, direct=plan.direct)
        helper = self.backend.exec_helper
        env_fd = env_memfd(launch.env) if helper else None
        seccomp_fd = (
            bytes_memfd("sandfarm-seccomp", setup.seccomp) if helper and setup.seccomp else None
        )
        prefix = (
            setup.helper_argv(helper, env_fd, seccomp_fd, direct=launch.direct)
            if helper and env_fd is not None
            else None
        )
        if launch.direct and not prefix:  # no helper to fall back: bash runs it
            launch = dataclasses.replace(launch, argv=launch.argv[launch.direct :], direct=0)
        owned = [fd for fd in (env_fd, seccomp_fd) if fd is not None]
        fds = list(launch.fds)
        if prefix:
            fds += owned + ([setup.netns_fd] if setup.netns_fd is not None else [])
        try:
            outcome = run_captured(
                [*prefix, *launch.argv] if prefix else launch.argv,
                # the helper runs as root: it gets an empty environment, the job's via env_fd
                env={} if prefix else launch.env,
                cwd=str(self.ws.work),
                limits=self.spec.limits,
                deadline=plan.deadline,
                kill_tree=self.kill_tree,
                # with the helper, subprocess can vfork: no Python between fork and exec
                preexec_fn=None if prefix else setup,
                pass_fds=fds,
                stdin_data=plan.stdin,
                cancel=plan.cancel,
                watch=plan.watch,
            )
        except BaseException:
            if launch.status_fd is not None:
                os.close(launch.status_fd)
            raise
        finally:
            for fd in (*owned, *launch.fds):
                os.close(fd)
        return outcome, launch.status_fd

    def close(self) -> None:
        if not self.clean:
            with contextlib.suppress(Exception):
                self.kill_tree()
        if self.standby is not None:
            self.standby.discard()
            self.standby = None
            if self.slot.uid is not None:  # its wrapper's own children, as our zombies
                reap_zombies_of(self.slot.uid)
        try:
            self.ws.remove()
        finally:
            self.slot.end_session()


def _in_host_network(setup: ChildSetup) -> bool:
    """A network job's step, in the worker's namespace (the host's), where other jobs'
    sockets are too (bwrap without root makes a namespace itself, but has no uid then)."""
    return setup.netns_fd is None and not setup.private_net


def _read_all(fd: int) -> bytes:
    """Everything left in a pipe whose writers are all gone; closes it."""
    chunks = []
    try:
        os.set_blocking(fd, False)
        while chunk := os.read(fd, 4096):
            chunks.append(chunk)
    except BlockingIOError:
        pass
    finally:
        os.close(fd)
    return b"".join(chunks)


def write_script(path: Path, source: str, gid: int | None) -> None:
    """A step's script, readable by its slot's group only (not by other slots): one
    open, write and fchown, no path lookup after the first. Each step's name is new in a
    session's fresh scripts directory: a file already there is refused ("x", O_EXCL)."""
    mode = 0o640 if gid is not None else 0o644

    def no_symlink(name: str, flags: int) -> int:
        return os.open(name, flags | os.O_NOFOLLOW, mode)

    with open(path, "xb", opener=no_symlink) as script:
        script.write(source.encode())
        if gid is not None:
            os.fchown(script.fileno(), 0, gid)
            os.fchmod(script.fileno(), 0o640)

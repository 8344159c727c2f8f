"""What the process and bwrap backends share: a host workspace in a slot, a per-job
cgroup, child setup before exec, and supervised capture of each step."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time
from abc import abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass, field

from sandbox_core import cgroups, slots
from sandbox_core import defaults as d
from sandbox_core.backends.base import Backend, Protection, Session
from sandbox_core.backends.config import LocalConfig
from sandbox_core.backends.steps import clean_environment, direct_words, script_argv, source_of
from sandbox_core.cgroups import JobCgroup
from sandbox_core.childsetup import (
    ChildSetup,
    bytes_memfd,
    env_memfd,
    find_exec_helper,
    rlimits_for,
)
from sandbox_core.models import CollectedFile, ExecStep, JobSpec, PythonStep
from sandbox_core.output import HeadTailBuffer
from sandbox_core.runner import ExecOutcome, apply_init_record, run_captured
from sandbox_core.seccomp import job_filter
from sandbox_core.sweep import become_subreaper, reap_zombies_of, sweep_uid
from sandbox_core.workspace import Workspace


@dataclass(frozen=True)
class Launch:
    """The program to exec, the environment it gets, fds it inherits (closed after), and
    the read end of the pipe our init writes the job's real wait status to, if any."""

    argv: list[str]
    env: dict[str, str]
    fds: list[int] = field(default_factory=list)
    status_fd: int | None = None
    direct: int = 0  # argv starts with this many words the helper may exec without bash


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
            if self.cgroup is not None:
                self.cgroup.set_limits(
                    memory_bytes=spec.limits.memory_mb * d.MIB,
                    pids_max=spec.limits.processes + backend.helper_processes,
                    cpus=spec.limits.cpus,
                )
        except BaseException:
            self.close()
            raise
        self.paths = backend.sandbox_paths(self)

    # files: every job process is dead between steps, so the guard cannot be raced
    def write_file(self, path: str, content: bytes) -> None:
        self.ws.write_file(path, content)

    def read_into(self, path: str, buffer: HeadTailBuffer) -> None:
        self.ws.read_into(path, buffer)

    def collect(self, patterns: list[str]) -> tuple[list[CollectedFile], int]:
        return self.ws.collect(patterns)

    def kill_tree(self) -> None:
        if self.cgroup is not None:
            self.cgroup.kill()
        elif self.slot.uid is not None:
            sweep_uid(self.slot.uid)

    def exec(
        self, step: ExecStep, index: int, deadline: float, cancel: threading.Event | None
    ) -> ExecOutcome:
        script = self.scripts / f"step-{index}"
        script.write_text(source_of(step))
        if self.slot.gid is not None:  # readable by this job only, not by other slots
            os.chown(script, 0, self.slot.gid)
            script.chmod(0o640)
        argv = script_argv(step, self.backend.python, f"{self.paths.scripts}/step-{index}")
        limits = self.spec.limits
        ooms_before = self.cgroup.oom_kills() if self.cgroup else 0
        cpu_before = self.cgroup.cpu_ns() if self.cgroup else 0
        self.clean = False
        setup = self.backend.child_setup(self)
        env = self.backend.environment(self)
        words = None
        if not isinstance(step, PythonStep) and self.backend.runs_direct(setup):
            words = direct_words(step.command, env)  # the script stays as the fallback
        launch = self.backend.wrap(self, [*(words or ()), *argv], env, direct=len(words or ()))
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
                limits=limits,
                deadline=deadline,
                kill_tree=self.kill_tree,
                # with the helper, subprocess can vfork: no Python between fork and exec
                preexec_fn=None if prefix else setup,
                pass_fds=fds,
                stdin_data=step.stdin.encode() if step.stdin else None,
                cancel=cancel,
            )
        finally:
            for fd in (*owned, *launch.fds):
                os.close(fd)
            self.kill_tree()  # nothing a step started outlives it, daemon or not
            self.clean = True
            if self.slot.uid is not None:
                reap_zombies_of(self.slot.uid)
            record = _read_all(launch.status_fd) if launch.status_fd is not None else None
        if record:
            # Our init's word on the job (else it was killed with the sandbox on a
            # timeout, flood or cancel, or never started: the sandbox's own exit stands).
            apply_init_record(outcome, record)
        outcome.memory_exceeded = bool(self.cgroup and self.cgroup.oom_kills() > ooms_before)
        if self.cgroup is not None:
            outcome.cpu_ms = max(outcome.cpu_ms, (self.cgroup.cpu_ns() - cpu_before) / 1e6)
        return outcome

    def close(self) -> None:
        if not self.clean:
            with contextlib.suppress(Exception):
                self.kill_tree()
        self.ws.remove()


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


class LocalBackend(Backend):
    """Base of the backends that run jobs as host processes in a slot."""

    session_class: type[LocalSession] = LocalSession
    # Processes a wrapper keeps alive beside the job (bwrap: 2); the job's limit comes on top.
    helper_processes = 0

    def __init__(self, config: LocalConfig) -> None:
        super().__init__(config)
        self.workspace_dir = config.workspace_dir
        self.python = config.python
        self.exec_helper = find_exec_helper(config.exec_helper)
        self.is_root = os.geteuid() == 0
        self.favors_dynmods: bool | None = None  # read once: it changes only by a remount
        if self.is_root:
            become_subreaper()
            if config.favor_dynmods:
                cgroups.favor_dynmods()
            self.favors_dynmods = cgroups.favors_dynmods()
        self.slots = slots.SlotPool(config.slot, config.workspace_dir)

    @contextlib.contextmanager
    def open_session(self, spec: JobSpec) -> Iterator[LocalSession]:
        asked = time.monotonic()
        with self.slots.borrow() as slot:
            waited_ms = (time.monotonic() - asked) * 1000
            session = self.session_class(self, spec, slot)
            session.slot_wait_ms = waited_ms
            try:
                yield session
            finally:
                session.close()

    def close(self) -> None:
        """Release the slots this backend holds."""
        self.slots.close()

    def required_protections(self, spec: JobSpec) -> list[str]:
        required = super().required_protections(spec)
        if self.is_root:
            # the job's tmpfs mounts are bounded only by its memory cgroup; its CPU use,
            # which other slots share, only by its CPU cgroup
            required += ["memory_cgroup", "cpu_cgroup"]
        return required

    def environment(self, session: LocalSession) -> dict[str, str]:
        return clean_environment(session.paths.work, session.paths.tmp, session.spec.env)

    def common_protections(self) -> list[Protection]:
        layout = cgroups.detect() if self.is_root else None
        why_not_root = "the worker does not run as root"

        def cg(name: str, available: bool, what: str) -> Protection:
            if layout is None:
                return Protection(name, False, why_not_root)
            detail = what if available else "; ".join(layout.problems) or "not available"
            return Protection(name, available, detail)

        clash = slots.uid_range_problem() if self.is_root else why_not_root
        return [
            Protection("rlimits", True, "CPU, file size, processes, files, core"),
            Protection(
                "uid_isolation",
                clash is None,
                f"slot i runs as uid {d.SLOT_UID_BASE}+i, no host account"
                if clash is None
                else clash,
            ),
            cg(
                "memory_cgroup",
                bool(layout and layout.memory),
                "per-job memory cap; its OOM kills are what memory_exceeded means",
            ),
            cg("pids_cgroup", bool(layout and layout.pids), "per-job process cap"),
            cg("cpu_cgroup", bool(layout and layout.cpu), "per-job CPU cap (limits.cpus)"),
            Protection(
                "exec_helper",
                self.exec_helper is not None,
                f"{self.exec_helper}: vfork + exec, no Python between"
                if self.exec_helper
                else "sandfarm-exec not built (make setup): Python child setup, slower",
            ),
            self.cgroup_attach_protection(),
            Protection(
                "workspace_quota",
                self.is_root,
                "tmpfs of workspace_mb per job" if self.is_root else why_not_root,
            ),
        ]

    def cgroup_attach_protection(self) -> Protection:
        """Not a protection but its price: without favordynmods each step waits ~8 ms."""
        favored = self.favors_dynmods
        if favored:
            return Protection("fast_cgroup_attach", True, "cgroup2 mounted with favordynmods")
        why = (
            "no cgroup2 mount or not root"
            if favored is None
            else "cgroup2 without favordynmods (SANDFARM_CGROUP_FAVORDYNMODS=false or the"
            " kernel refused): each step waits ~8 ms to join its cgroups"
        )
        return Protection("fast_cgroup_attach", False, why)

    def syscall_filter_protection(self) -> Protection:
        program = job_filter()
        if program is None:
            return Protection("syscall_filter", False, f"no seccomp policy for {os.uname()[4]}")
        return Protection(
            "syscall_filter",
            True,
            f"seccomp allowlist ({len(program) // 8} BPF instructions): moby's default"
            " profile, no io_uring, bpf, perf, keyrings, mounts, namespaces, AF_VSOCK",
        )

    def tree_kill_protection(self) -> Protection:
        if not self.is_root:
            return Protection("tree_kill", False, "process group only: " + "not root")
        layout = cgroups.detect()
        if layout.kill_v2 is not None:
            return Protection("tree_kill", True, f"cgroup v2 cgroup.kill under {layout.kill_v2}")
        if layout.freezer_v1 is not None:
            return Protection("tree_kill", True, f"cgroup v1 freezer under {layout.freezer_v1}")
        return Protection("tree_kill", True, "per-slot uid sweep (no usable cgroup)")

    @abstractmethod
    def sandbox_paths(self, session: LocalSession) -> SandboxPaths: ...

    @abstractmethod
    def wrap(
        self, session: LocalSession, argv: list[str], env: dict[str, str], direct: int = 0
    ) -> Launch:
        """What to exec for ``argv`` with the job's ``env`` (a wrapper may take both);
        ``direct``: argv's first words are a simple command (see runs_direct)."""

    def runs_direct(self, setup: ChildSetup) -> bool:
        """Whether the step's last exec is the helper's, which can run a simple command
        without bash and fall back to its script (sandfarm-exec --direct)."""
        return False

    @abstractmethod
    def child_setup(self, session: LocalSession) -> ChildSetup: ...

    def base_child_setup(self, session: LocalSession, private_net: bool) -> ChildSetup:
        return ChildSetup(
            cgroup_procs=session.cgroup.procs_files if session.cgroup else (),
            private_net=private_net,
            net_as_root=self.is_root,
            # With a memory cgroup, that is the memory bound (and an OOM kill its honest
            # signal); an address-space rlimit would fail allocations first, and a job
            # could then fake memory_exceeded by printing an allocation error.
            rlimits=rlimits_for(
                session.spec.limits,
                address_space=session.cgroup is None or session.cgroup.layout.memory is None,
            ),
            uid=session.slot.uid,
            gid=session.slot.gid,
        )

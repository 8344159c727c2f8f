"""L2: the bubblewrap sandbox. The process sandbox's slot, uid, rlimits and cgroup, plus
fresh user, pid, mount, network, IPC, UTS and cgroup namespaces around every step.

The job sees a read-only /usr, a handful of /etc files (passwd, group and hosts are
written per job, never the host's), its workspace at /workspace, a private /tmp and
/dev/shm, a minimal /dev with its own ptys, its /proc, and nothing else of the host: no
/home, /root, /run, host /tmp or worker files. Everything outside /workspace, /tmp and
/dev/shm is read-only. bwrap runs unprivileged (it is not setuid on Debian): ChildSetup
drops to the slot uid and sets no_new_privs first, and bwrap builds the namespaces in a
user namespace, loads the job's syscall filter and starts our init as pid 1, which
reports the job's real wait status on a pipe the job never holds.
"""

from __future__ import annotations

import dataclasses
import os
import resource
import threading

from sandbox_core import slots
from sandbox_core.backends.base import Protection
from sandbox_core.backends.bwrap.host import (
    INIT,
    SANDBOX_ETC,
    SCRIPTS,
    TMP,
    WORK,
    etc_files,
    network_etc_args,
    probe,
    static_args,
    tini,
)
from sandbox_core.backends.local import Launch, LocalBackend, LocalSession, SandboxPaths
from sandbox_core.childsetup import ChildSetup, bytes_memfd, mount_devpts, statically_linked
from sandbox_core.errors import BackendUnavailableError, ProtectionUnavailableError
from sandbox_core.models import ExecStep, JobSpec
from sandbox_core.runner import ExecOutcome, signal_from_init_status
from sandbox_core.seccomp import job_filter


class BwrapSession(LocalSession):
    """A LocalSession with the per-job files only the sandbox sees: /etc, /dev/shm and,
    as root, a devpts instance of the job's own (at most ``limits.ptys``)."""

    def __init__(self, backend: LocalBackend, spec: JobSpec, slot: slots.Slot) -> None:
        super().__init__(backend, spec, slot)
        try:
            self.etc = self.ws.root / "etc"  # worker-owned: the job reads, never edits
            self.etc.mkdir(mode=0o755)
            uid = self.slot.uid if self.slot.uid is not None else os.getuid()
            gid = self.slot.gid if self.slot.gid is not None else os.getgid()
            for name, text in etc_files(uid, gid).items():
                (self.etc / name).write_text(text)
                (self.etc / name).chmod(0o644)
            self.shm = self.ws.root / "shm"
            self.shm.mkdir(mode=0o700)
            self.pts = None
            if self.slot.uid is not None:
                os.chown(self.shm, uid, gid)
                # Under the workspace root: unmounted with it, hidden from other slots.
                self.pts = self.ws.root / "pts"
                self.pts.mkdir(mode=0o755)
                mount_devpts(str(self.pts), spec.limits.ptys)
        except BaseException:
            self.close()
            raise

    def exec(
        self, step: ExecStep, index: int, deadline: float, cancel: threading.Event | None
    ) -> ExecOutcome:
        outcome = super().exec(step, index, deadline, cancel)
        if not isinstance(self.backend, BwrapBackend) or not self.backend.own_init:
            # tini or bwrap's init report a child killed by signal N as exit 128+N: the
            # best there is without our init (a job's own exit 129..192 reads as a signal).
            signal_from_init_status(outcome)
        return outcome


class BwrapBackend(LocalBackend):
    name = "bwrap"
    session_class = BwrapSession
    helper_processes = 2  # bwrap outside, and the init (ours, tini or bwrap's) as pid 1

    @property
    def own_init(self) -> bool:
        """Our init (sandfarm-exec --init) runs as pid 1 and reports real wait statuses:
        only a static build, since a cold step's init gets the job's environment (an
        attack review: a dynamic one loaded the job's LD_PRELOAD and forged its status)."""
        helper = self.exec_helper
        return helper is not None and statically_linked(helper) and probe().as_pid_1

    def protections(self) -> list[Protection]:
        found = probe()
        common = self.common_protections()
        if not found.ok:
            off = found.detail
            return [
                *common,
                *(
                    Protection(name, False, off)
                    for name in (
                        "tree_kill",
                        "network_isolation",
                        "pid_namespace",
                        "filesystem_isolation",
                        "nested_userns_blocked",
                        "syscall_filter",
                        "honest_status",
                    )
                ),
            ]
        host_kill = self.tree_kill_protection()
        init = "sandfarm-exec --init" if self.own_init else ("tini" if tini() else "bwrap")
        pid_ns = f"pid namespace: its init ({init}) takes every process down with it"
        kill_detail = f"{host_kill.detail}; {pid_ns}" if host_kill.active else pid_ns
        return [
            *common,
            Protection("tree_kill", True, kill_detail),
            Protection(
                "network_isolation",
                True,
                "the slot's loopback-only network namespace, where the job holds no capability"
                if self.is_root
                else "bwrap's own network namespace, loopback only",
            ),
            Protection(
                "pid_namespace",
                True,
                "the job sees and signals only its own processes"
                + ("" if found.as_pid_1 else "; the host's init reaps bwrap's init"),
            ),
            Protection(
                "filesystem_isolation",
                True,
                "read-only /usr and a few /etc files; private /workspace, /tmp, /dev/shm;"
                " no /home, /root, /run, host /tmp or worker files",
            ),
            Protection(
                "nested_userns_blocked",
                found.disable_userns,
                "--disable-userns: no namespaces inside the sandbox"
                if found.disable_userns
                else "bubblewrap < 0.8: the job may create user namespaces",
            ),
            self.syscall_filter_protection(),
            Protection(
                "honest_status",
                self.own_init,
                "pid 1 is our init: the job's real wait status, never an exit code it chose"
                if self.own_init
                else "no static exec helper or no --as-pid-1: exit 128+N reads as signal N",
            ),
            Protection(
                "private_ptys",
                self.is_root,
                "a devpts instance per job, at most limits.ptys"
                if self.is_root
                else "not root: bwrap's own devpts, unbounded",
            ),
        ]

    def required_protections(self, spec: JobSpec) -> list[str]:
        required = [*super().required_protections(spec), "pid_namespace", "filesystem_isolation"]
        return [*required, "syscall_filter"]

    def ensure_available(self) -> None:
        found = probe()
        if not found.ok:
            raise BackendUnavailableError(f"{found.detail}; see ops/setup.sh")

    def check(self, spec: JobSpec) -> None:
        found = probe()
        if not found.ok:  # even allow_weaker cannot run a sandbox without bwrap
            raise ProtectionUnavailableError("filesystem_isolation", found.detail)
        super().check(spec)

    def sandbox_paths(self, session: LocalSession) -> SandboxPaths:
        return SandboxPaths(work=WORK, tmp=TMP, scripts=SCRIPTS)

    def runs_direct(self, setup: ChildSetup) -> bool:
        return self.own_init  # our init execs the job (tini's or bwrap's would not fall back)

    def wrap(
        self, session: LocalSession, argv: list[str], env: dict[str, str], direct: int = 0
    ) -> Launch:
        return self._launch(session, argv, env, direct)

    def standby_launch(self, session: LocalSession, go_fd: int) -> Launch | None:
        # only our init can wait for a job: the helper execs bwrap, not the job
        return self._launch(session, [], {}, standby_fd=go_fd) if self.own_init else None

    def _launch(
        self,
        session: LocalSession,
        argv: list[str],
        env: dict[str, str],
        direct: int = 0,
        standby_fd: int | None = None,
    ) -> Launch:
        assert isinstance(session, BwrapSession)
        found = probe()
        ws, slot = session.ws, session.slot
        # The options (the job's environment among them) reach bwrap through --args, a
        # memfd: never on its command line, which other uids can read in /proc. bwrap
        # itself runs with a fixed environment, so the job's LD_PRELOAD cannot subvert it.
        args = [*static_args(), *found.options, "--clearenv"]
        for name, value in env.items():
            args += ["--setenv", name, value]
        if session.spec.limits.network:
            args += ["--share-net", *network_etc_args()]
        elif self.joins_slot_network(session):
            args.append("--share-net")  # the slot's namespace, joined in child_setup
        if slot.uid is not None:
            args += ["--uid", str(slot.uid), "--gid", str(slot.gid)]
        if session.pts is not None:
            args += ["--dev-bind", str(session.pts), "/dev/pts"]
        fds: list[int] = []
        program = job_filter()
        if program is not None:  # loaded by bwrap just before it execs pid 1
            fds.append(bytes_memfd("sandfarm-seccomp", program))
            args += ["--seccomp", str(fds[-1])]
        args += [
            "--ro-bind",
            str(session.etc),
            SANDBOX_ETC,
            "--bind",
            str(ws.work),
            WORK,
            "--bind",
            str(ws.tmp),
            TMP,
            "--bind",
            str(session.shm),
            "/dev/shm",
            "--ro-bind",
            str(session.scripts),
            SCRIPTS,
            "--chdir",
            WORK,
        ]
        status_fd = None
        init: list[str] = []
        if self.own_init:
            assert self.exec_helper is not None
            status_fd, status_w = os.pipe2(os.O_CLOEXEC)
            os.set_inheritable(status_w, True)
            fds.append(status_w)
            args += ["--ro-bind", self.exec_helper, INIT, "--as-pid-1"]
            if standby_fd is not None:  # our init waits for the job's argv and env
                os.set_inheritable(standby_fd, True)
                fds.append(standby_fd)
            init = [
                INIT,
                "--init",
                str(status_w),
                *(["--direct", str(direct)] if direct else []),
                *(["--standby", str(standby_fd)] if standby_fd is not None else []),
                "--",
            ]
            direct = 0
        elif found.as_pid_1 and tini():
            args.append("--as-pid-1")
            init = list(tini())
        if direct:  # no init of ours to fall back to the script: bash runs it
            argv, direct = argv[direct:], 0
        # last: / and /dev read-only, the binds above stay as they are
        args += ["--remount-ro", "/", "--remount-ro", "/dev"]
        fds.insert(
            0, bytes_memfd("sandfarm-bwrap-args", b"".join(a.encode() + b"\0" for a in args))
        )
        command = [found.path or "bwrap", "--args", str(fds[0]), "--", *init, *argv]
        waits = standby_fd is not None  # our init has it (standby_launch needs own_init)
        return Launch(command, {"PATH": "/usr/bin:/bin"}, fds, status_fd, waits=waits)

    def joins_slot_network(self, session: LocalSession) -> bool:
        """As root, a job without network joins its session's loopback-only namespace
        (as the process backend does) rather than paying for a new one per step."""
        return self.is_root and not session.spec.limits.network

    def child_setup(self, session: LocalSession) -> ChildSetup:
        setup = self.base_child_setup(session, private_net=False)
        if self.joins_slot_network(session):
            setup = dataclasses.replace(setup, netns_fd=session.slot.network_namespace())
        # RLIMIT_NPROC counts bwrap's own processes too.
        rlimits = [
            (res, soft + self.helper_processes, hard + self.helper_processes)
            if res == resource.RLIMIT_NPROC
            else (res, soft, hard)
            for res, soft, hard in setup.rlimits
        ]
        return dataclasses.replace(setup, rlimits=rlimits)

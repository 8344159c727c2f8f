"""L1: the process-group sandbox. Host filesystem readable; everything else locked."""

from __future__ import annotations

import os
import platform
from functools import cache, cached_property

from sandbox_core import landlock, slots
from sandbox_core.backends.base import Protection
from sandbox_core.backends.local import Launch, LocalBackend, LocalSession, SandboxPaths
from sandbox_core.childsetup import ChildSetup, private_dirs, private_network
from sandbox_core.models import JobSpec
from sandbox_core.seccomp import job_filter


@cache
def user_namespaces_work() -> bool:
    """Can an unprivileged process make a user + network namespace here? (probe in a child)"""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        try:
            private_network(as_root=False)
            os._exit(0)
        except BaseException:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    return os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


class ProcessBackend(LocalBackend):
    name = "process"

    def protections(self) -> list[Protection]:
        if self.is_root:
            net = Protection("network_isolation", True, "the slot's own namespace, loopback only")
        elif user_namespaces_work():
            net = Protection("network_isolation", True, "user + network namespace, loopback only")
        else:
            net = Protection("network_isolation", False, "not root and no user namespaces")
        private_tmp = Protection(
            "private_tmp",
            self.is_root,
            "own mount + IPC namespace: tmpfs over /tmp, /var/tmp, /dev/shm and /run, a fresh"
            " mqueue, /proc with hidepid=invisible, no other job's workspace mounted"
            if self.is_root
            else "not root: the host's /tmp and /dev/shm are shared",
        )
        ptys = Protection(
            "private_ptys",
            self.is_root,
            "a devpts instance per step, at most limits.ptys"
            if self.is_root
            else "not root: the host's /dev/pts is shared",
        )
        userns = Protection(
            "nested_userns_blocked",
            job_filter() is not None,
            "seccomp: no new namespaces of any kind"
            if job_filter() is not None
            else f"no seccomp filter for {platform.machine()}",
        )
        status = Protection(
            "honest_status", True, "the job's own wait status, straight from the kernel"
        )
        protections = [*self.common_protections(), self.tree_kill_protection(), net]
        return [*protections, private_tmp, ptys, userns, self.syscall_filter_protection(), status]

    def required_protections(self, spec: JobSpec) -> list[str]:
        required = super().required_protections(spec)
        return [*required, "nested_userns_blocked", "syscall_filter"]

    def sandbox_paths(self, session: LocalSession) -> SandboxPaths:
        ws = session.ws
        return SandboxPaths(work=str(ws.work), tmp=str(ws.tmp), scripts=str(session.scripts))

    def wrap(
        self, session: LocalSession, argv: list[str], env: dict[str, str], direct: int = 0
    ) -> Launch:
        return Launch(argv, env, direct=direct)

    def runs_direct(self, setup: ChildSetup) -> bool:
        # the helper execs the job itself, unless only Python can set it up
        return self.exec_helper is not None and not (setup.private_net and setup.netns_fd is None)

    def child_setup(self, session: LocalSession) -> ChildSetup:
        limits = session.spec.limits
        private_net = not limits.network
        if not self.is_root:
            return self.base_child_setup(session, private_net, seccomp=job_filter())
        # Own /tmp, /var/tmp, /dev/shm and IPC: nothing left there for the next job; own
        # ptys (the host's table is shared); no other job's workspace in its mounts.
        return self.base_child_setup(
            session,
            private_net,
            seccomp=job_filter(),
            private_tmp_mb=limits.workspace_mb,
            devpts_max=limits.ptys,
            hide_under=self._hide_under,
            keep=str(session.ws.root),
            netns_fd=session.slot.network_namespace() if private_net else None,
            # no socket file where another job may reach it (landlock.py)
            sock_dirs=(
                (str(session.ws.root), *private_dirs()) if landlock.bounds_socket_files() else ()
            ),
        )

    @cached_property
    def _hide_under(self) -> str:
        return str(slots.workspace_base(self.workspace_dir))

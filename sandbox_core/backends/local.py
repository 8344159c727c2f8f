"""What the process and bwrap backends share: sessions in slots (local_session), the
protections of a host-process sandbox, and child setup before exec."""

from __future__ import annotations

import contextlib
import os
import time
from abc import abstractmethod
from collections.abc import Iterator
from typing import Any

from sandbox_core import cgroups, landlock, slots
from sandbox_core import defaults as d
from sandbox_core.backends import prewarm
from sandbox_core.backends.base import Backend, Protection
from sandbox_core.backends.config import LocalConfig
from sandbox_core.backends.local_session import Launch, LocalSession, SandboxPaths
from sandbox_core.backends.steps import clean_environment
from sandbox_core.childsetup import ChildSetup, find_exec_helper, rlimits_for
from sandbox_core.errors import SlotBusyError
from sandbox_core.models import JobSpec
from sandbox_core.seccomp import job_filter
from sandbox_core.sweep import become_subreaper

__all__ = ["Launch", "LocalBackend", "LocalSession", "SandboxPaths"]


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
        lanes = (config.slot, config.spare_slot) if config.slot is not None else ()
        self.slots = slots.SlotPool(tuple(i for i in lanes if i is not None), config.workspace_dir)
        # as root only: a standby's isolation from other jobs is its slot's uid
        self.prewarms = config.prewarm and self.is_root and self.exec_helper is not None

    @contextlib.contextmanager
    def open_session(self, spec: JobSpec) -> Iterator[LocalSession]:
        asked = time.monotonic()
        # Fixed slots are shared by this process's backends: whatever standby another one
        # left there is closed first when a cold session needs its slot, prewarm or not.
        shared = bool(self.slots.lanes)
        session = prewarm.take(self, spec) if self.prewarms or shared else None
        waited_s = time.monotonic() - asked
        if session is None:
            slot = self.slots.take()
            # the wait ends with the slot: making the session there is the job's setup
            # (its deadline and fair-share charge count it; an attack review)
            waited_s = time.monotonic() - asked
            try:
                session = self.session_class(self, spec, slot)
            except BaseException:
                self.slots.give(slot)
                raise
        session.slot_wait_ms = waited_s * 1000
        try:
            yield session
        finally:
            if self.prewarms:  # torn down after the result, the next one made there
                prewarm.retire(self, session, now=session.ws.heavy())
            else:
                try:
                    session.close()
                finally:
                    self.slots.give(session.slot)

    def standby_session(self, spec: JobSpec) -> LocalSession | None:
        """A session of ``spec``'s shape in a free slot, its first step's sandbox set up
        and waiting (see prewarm), or None where this backend cannot make one (or no slot
        is free now: a standby never waits for one)."""
        try:
            slot = self.slots.take(timeout_s=0)
        except SlotBusyError:
            return None
        if slot.cgroup is None or not slot.cgroup.none_left():  # not provably empty: none
            self.slots.give(slot)
            return None
        try:
            session = self.session_class(self, spec, slot)
        except BaseException:
            self.slots.give(slot)
            raise
        started = False
        try:
            started = session.start_standby()
        finally:
            if not started:
                try:
                    session.close()
                finally:
                    self.slots.give(slot)
        return session if started else None

    def close(self) -> None:
        """Release the slots this backend holds."""
        prewarm.discard(self)
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
                "unix_socket_scope",
                landlock.scopes_abstract_unix(),
                landlock.why_unscoped()
                or "Landlock: no abstract Unix socket made outside the job (network jobs"
                " share the host's namespace); process jobs make socket files only in"
                " their own directories",
            ),
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

    def standby_launch(self, session: LocalSession, go_fd: int) -> Launch | None:
        """What a standby's helper execs, the job to come on ``go_fd``: a wrapper whose
        init waits there (Launch.waits), nothing (the helper itself waits), or None where
        this backend cannot make a standby."""
        return Launch([], {})

    def runs_direct(self, setup: ChildSetup) -> bool:
        """Whether the step's last exec is the helper's, which can run a simple command
        without bash and fall back to its script (sandfarm-exec --direct)."""
        return False

    @abstractmethod
    def child_setup(self, session: LocalSession) -> ChildSetup: ...

    def base_child_setup(self, session: LocalSession, private_net: bool, **more: Any) -> ChildSetup:
        """The setup every local step shares, plus ``more`` of ChildSetup's fields (one
        construction: a step builds this once, before its start)."""
        cgroup = session.cgroup
        return ChildSetup(
            cgroup_procs=cgroup.procs_files if cgroup else (),
            private_net=private_net,
            net_as_root=self.is_root,
            # With a memory cgroup, that is the memory bound (and an OOM kill its honest
            # signal); an address-space rlimit would fail allocations first, and a job
            # could then fake memory_exceeded by printing an allocation error.
            rlimits=rlimits_for(
                session.spec.limits,
                address_space=cgroup is None or cgroup.layout.memory is None,
            ),
            uid=session.slot.uid,
            gid=session.slot.gid,
            landlock_scope=(
                landlock.SCOPE_ABSTRACT_UNIX_SOCKET if landlock.scopes_abstract_unix() else 0
            ),
            **more,
        )

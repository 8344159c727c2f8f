"""Per-job cgroups: whole-tree kill (v2 cgroup.kill or v1 freezer), memory/pids/CPU caps,
and the kernel's own counts of OOM kills and CPU time.

Works on pure cgroup v2, hybrid (v1 controllers + an empty v2 tree, as on this farm's
hosts) and pure v1. Job groups nest under the worker's own cgroup in each hierarchy,
so a host's accounting of the worker still covers its jobs.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from sandbox_core import defaults as d
from sandbox_core.cgroupfiles import (
    OpenFiles,
    freeze_and_kill,
    oom_file,
    parse_oom_kills,
    peak_file,
)
from sandbox_core.cgroupmount import CGROUP_ROOT, cgroup2_mount, favor_dynmods, favors_dynmods
from sandbox_core.memorybound import bound_farm_memory, farm_memory_limit, mem_total

__all__ = [
    "CGROUP_ROOT",
    "CgroupLayout",
    "JobCgroup",
    "cgroup2_mount",
    "detect",
    "farm_memory_limit",
    "favor_dynmods",
    "favors_dynmods",
    "mem_total",
    "remove_stale",
]
PARENT_NAME = "sandfarm"
TCP_LIMIT_V1 = "memory.kmem.tcp.limit_in_bytes"  # v1 charges socket buffers only under one
TCP_USAGE_V1 = "memory.kmem.tcp.usage_in_bytes"  # what it holds (past it: tcpwatch.py)
CPU_PERIOD_US = 100_000  # the CFS period the CPU quota is a share of


@dataclass(frozen=True)
class CgroupLayout:
    """Where each mechanism lives on this host; a None means unavailable."""

    kill_v2: Path | None = None  # directory whose children have cgroup.kill
    freezer_v1: Path | None = None
    memory: Path | None = None
    memory_v2: bool = False
    pids: Path | None = None
    pids_v2: bool = False
    cpu: Path | None = None  # the CPU cap: v2 cpu.max, v1 cpu.cfs_quota_us
    cpu_v2: bool = False
    cpuacct: Path | None = None  # CPU time used: v2 cpu.stat, v1 cpuacct.usage
    memory_bound: int | None = None  # bytes all jobs under ``memory`` may hold together
    problems: tuple[str, ...] = ()

    @property
    def bases(self) -> list[Path]:
        """Every parent directory in use, one per hierarchy (a path may serve several)."""
        found = [self.kill_v2, self.freezer_v1, self.memory, self.pids, self.cpu, self.cpuacct]
        return list(dict.fromkeys(p for p in found if p is not None))

    @property
    def can_kill_tree(self) -> bool:
        return self.kill_v2 is not None or self.freezer_v1 is not None


def _own_paths() -> dict[str, str]:
    """hierarchy controller name (or '' for v2) -> this process's cgroup path."""
    paths: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            for name in controllers.split(",") if controllers else [""]:
                paths[name] = path
    return paths


def _prepare(base: Path, problems: list[str]) -> Path | None:
    parent = base / PARENT_NAME
    try:
        parent.mkdir(exist_ok=True)
        return parent
    except OSError as exc:
        problems.append(f"{parent}: {exc.strerror}")
        return None


def tcp_buffers_limit(memory_bytes: int) -> int:
    """A job's TCP socket buffers at most, for cgroup v1 (defaults.TCP_BUFFERS_BYTES)."""
    return min(memory_bytes, d.TCP_BUFFERS_BYTES)


@cache
def detect() -> CgroupLayout:
    if os.geteuid() != 0:
        return CgroupLayout(problems=("not root: cannot create cgroups",))
    own = _own_paths()
    problems: list[str] = []
    if (CGROUP_ROOT / "cgroup.controllers").exists():  # pure v2
        parent = _prepare(CGROUP_ROOT / own.get("", "/").lstrip("/"), problems)
        if parent is None:
            return CgroupLayout(problems=tuple(problems))
        available = (parent.parent / "cgroup.controllers").read_text().split()
        enabled = []
        for ctrl in ("memory", "pids", "cpu"):
            if ctrl in available:
                with contextlib.suppress(OSError):
                    (parent / "cgroup.subtree_control").write_text(f"+{ctrl}")
                    enabled.append(ctrl)
        memory = parent if "memory" in enabled else None
        return CgroupLayout(
            kill_v2=parent,
            memory=memory,
            memory_v2=True,
            memory_bound=bound_farm_memory(memory, True, problems, farm_memory_limit()),
            pids=parent if "pids" in enabled else None,
            pids_v2=True,
            cpu=parent if "cpu" in enabled else None,
            cpu_v2=True,
            cpuacct=parent,  # cpu.stat's usage_usec is there without the cpu controller
            problems=tuple(problems),
        )
    kill_v2 = None
    unified = CGROUP_ROOT / "unified"
    if (unified / "cgroup.procs").exists():
        candidate = _prepare(unified / own.get("", "/").lstrip("/"), problems)
        if candidate is not None and _has_kill(candidate):
            kill_v2 = candidate

    def v1(ctrl: str) -> Path | None:
        mount = (CGROUP_ROOT / ctrl).resolve()  # cpu and cpuacct may be one "cpu,cpuacct"
        if not (mount / "cgroup.procs").exists():
            problems.append(f"no cgroup v1 {ctrl} hierarchy")
            return None
        return _prepare(mount / own.get(ctrl, "/").lstrip("/"), problems)

    memory = v1("memory")
    return CgroupLayout(
        kill_v2=kill_v2,
        freezer_v1=None if kill_v2 else v1("freezer"),
        memory=memory,
        memory_bound=bound_farm_memory(memory, False, problems, farm_memory_limit()),
        pids=v1("pids"),
        cpu=v1("cpu"),
        cpuacct=v1("cpuacct"),
        problems=tuple(problems),
    )


def _has_kill(parent: Path) -> bool:
    probe = parent / f"probe-{os.getpid()}"
    try:
        probe.mkdir(exist_ok=True)
        return (probe / "cgroup.kill").exists()
    except OSError:
        return False
    finally:
        with contextlib.suppress(OSError):
            probe.rmdir()


@dataclass
class JobCgroup:
    """The cgroups of one job (one directory per hierarchy in use)."""

    name: str
    layout: CgroupLayout
    dirs: list[Path] = field(default_factory=list)
    _limits: tuple[int, int, float | None] | None = None  # what set_limits last wrote
    files: OpenFiles = field(default_factory=OpenFiles, repr=False, compare=False)
    # The paths read or written after every step, built once (a slot's group lives long).
    _paths: dict[str, Path | None] = field(default_factory=dict, repr=False, compare=False)
    _procs: list[str] | None = field(default=None, repr=False, compare=False)
    _oom_seen: int | None = field(default=None, repr=False, compare=False)

    @classmethod
    def create(
        cls, name: str, memory_bytes: int, pids_max: int, cpus: float | None = None
    ) -> JobCgroup:
        layout = detect()
        group = cls(name, layout)
        try:
            for base in layout.bases:
                path = base / name
                path.mkdir(exist_ok=True)
                group.dirs.append(path)
            group.set_limits(memory_bytes, pids_max, cpus)
        except BaseException:
            group.remove()
            raise
        return group

    def set_limits(self, memory_bytes: int, pids_max: int, cpus: float | None = None) -> None:
        """(Re)set the caps; a slot's group is reused job after job with each job's limits.
        ``cpus``: CPU time per wall second (1.5 = one and a half cores); None: no cap."""
        if self._limits == (memory_bytes, pids_max, cpus):
            return
        layout, name = self.layout, self.name
        if layout.memory is not None:
            mem = layout.memory / name
            if layout.memory_v2:
                (mem / "memory.max").write_text(str(memory_bytes))
                with contextlib.suppress(OSError):
                    (mem / "memory.swap.max").write_text("0")
            else:
                # memsw must stay >= the memory limit: order the writes by direction
                files = ["memory.limit_in_bytes", "memory.memsw.limit_in_bytes"]
                current = int((mem / files[0]).read_text())
                for file in reversed(files) if memory_bytes > current else files:
                    if (mem / file).exists():  # memsw exists only with swap accounting
                        (mem / file).write_text(str(memory_bytes))
                tcp = mem / TCP_LIMIT_V1
                if tcp.exists():
                    tcp.write_text(str(tcp_buffers_limit(memory_bytes)))
            with contextlib.suppress(OSError):  # a peak under other limits says nothing
                (mem / peak_file(layout.memory_v2)).write_text("0")
        if layout.pids is not None:
            (layout.pids / name / "pids.max").write_text(str(pids_max))
        if layout.cpu is not None:
            quota = "max" if cpus is None else str(max(1000, int(cpus * CPU_PERIOD_US)))
            if layout.cpu_v2:
                (layout.cpu / name / "cpu.max").write_text(f"{quota} {CPU_PERIOD_US}")
            else:
                (layout.cpu / name / "cpu.cfs_period_us").write_text(str(CPU_PERIOD_US))
                v1_quota = "-1" if quota == "max" else quota
                (layout.cpu / name / "cpu.cfs_quota_us").write_text(v1_quota)
        self._limits = (memory_bytes, pids_max, cpus)

    def _path(self, what: str) -> Path | None:
        """The file of this group named by ``what`` ("cpu", "oom", "peak", "kill"), or None."""
        if what not in self._paths:
            layout, found = self.layout, None
            if what == "cpu" and layout.cpuacct is not None:
                name = "cpu.stat" if layout.cpu_v2 else "cpuacct.usage"
                found = layout.cpuacct / self.name / name
            elif what == "oom" and layout.memory is not None:
                found = layout.memory / self.name / oom_file(layout.memory_v2)
            elif what == "peak" and layout.memory is not None:
                found = layout.memory / self.name / peak_file(layout.memory_v2)
            elif what == "kill" and layout.kill_v2 is not None:
                found = layout.kill_v2 / self.name / "cgroup.kill"
            self._paths[what] = found
        return self._paths[what]

    def cpu_ns(self) -> int:
        """CPU time every process of this group has used so far, in nanoseconds (0 if the
        host does not count it)."""
        path = self._path("cpu")
        if path is None:
            return 0
        with contextlib.suppress(OSError, ValueError):
            if self.layout.cpu_v2:
                for line in self.files.read(path).decode().splitlines():
                    key, _, value = line.partition(" ")
                    if key == "usage_usec":
                        return int(value) * 1000
            else:
                return int(self.files.read(path))
        return 0

    @property
    def procs_files(self) -> list[str]:
        """Files the child writes its pid to, before exec, to join every hierarchy."""
        if self._procs is None:
            self._procs = [str(path / "cgroup.procs") for path in self.dirs]
        return self._procs

    def pids(self, dirs: list[Path] | None = None) -> set[int]:
        found: set[int] = set()
        for path in self.dirs if dirs is None else dirs:
            with contextlib.suppress(OSError):
                found.update(int(p) for p in (path / "cgroup.procs").read_text().split())
        return found

    def empty(self, dirs: list[Path] | None = None) -> bool:
        """Whether no process is provably in the group (in ``dirs``, default every
        hierarchy): a directory that is gone holds none; any other error says not empty.
        The cgroup2 file is kept open; a v1 one (it caches its pid list per open file
        for a second) is opened anew."""
        v2 = self.layout.kill_v2
        for path in self.dirs if dirs is None else dirs:
            procs = path / "cgroup.procs"
            try:
                if v2 is not None and path.parent == v2:
                    head = self.files.read(procs, 16)
                else:
                    with open(procs, "rb") as f:
                        head = f.read(16)
            except FileNotFoundError:
                continue
            except OSError:
                return False
            if head.strip():
                return False
        return True

    def none_left(self) -> bool:
        """Whether the group holds no process. The killing hierarchy's group holds every
        job process (a job joins all of them and cannot leave one): reading it alone is
        enough, and cheaper (on cgroup2, its file is kept open)."""
        return self.empty(self._kill_dirs())

    def kill(self, wait_s: float = 5.0) -> bool:
        """Kill every process in the group, even ones that called setsid; True when empty."""
        deadline = time.monotonic() + wait_s
        layout = self.layout
        pause = 0.002
        while True:
            kill_file = self._path("kill")
            if kill_file is not None:
                with contextlib.suppress(OSError):
                    self.files.write(kill_file, b"1")
            elif layout.freezer_v1 is not None:
                freeze_and_kill(layout.freezer_v1 / self.name)
            else:
                for pid in self.pids():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, 9)
            if self.none_left():
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(pause)
            pause = min(pause * 2, 0.05)  # a long exit (defaults.SLOT_KILL_WAIT_S) is rare

    def _kill_dirs(self) -> list[Path] | None:
        """This group's directory in the hierarchy that kills it (None: every one)."""
        if "kill_dirs" not in self._paths:
            root = self.layout.kill_v2 or self.layout.freezer_v1
            found = root / self.name if root is not None else None
            self._paths["kill_dirs"] = found if found in self.dirs else None
        own = self._paths["kill_dirs"]
        return [own] if own is not None else None

    def oom_kills(self) -> int:
        """How many processes of this group the kernel's OOM killer has killed so far."""
        path = self._path("oom")
        if path is None:
            return 0
        with contextlib.suppress(OSError):
            self._oom_seen = parse_oom_kills(self.files.read(path).decode())
            return self._oom_seen
        return 0

    def oom_kills_before(self) -> int:
        """The OOM count before a step: as the last read left it (after the slot's last
        step, which the group's kill ended; only the next sandbox's helper ran since),
        else read now."""
        return self._oom_seen if self._oom_seen is not None else self.oom_kills()

    def reached_own_limit(self) -> bool:
        """After an OOM kill: did this group's memory peak at its own limit (since the
        last ask, or its limits)? If not, a parent's bound killed it: the farm's. Unknown
        reads as yes (v2 before 5.19 has no peak; before 6.12 it cannot be reset)."""
        path = self._path("peak")
        if path is None or self._limits is None:
            return True
        with contextlib.suppress(OSError, ValueError):
            reached = int(self.files.read(path)) >= self._limits[0] - d.MIB  # charge batches
            self.files.write(path, b"0")  # the next ask sees only what came after
            return reached
        return True

    def remove(self) -> None:
        self.files.close()
        self._paths.clear()
        self._procs = None
        for path in self.dirs:
            for _ in range(50):
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.01)
        self.dirs.clear()


def remove_stale(name: str) -> int:
    """Kill and remove the group ``name`` and any ``name-*`` groups; returns how many."""
    layout = detect()
    names: set[str] = set()
    for base in layout.bases:
        with contextlib.suppress(OSError):
            names.update(
                p.name
                for p in base.iterdir()
                if p.is_dir() and (p.name == name or p.name.startswith(f"{name}-"))
            )
    for stale in names:
        group = JobCgroup(stale, layout)
        group.dirs = [base / stale for base in layout.bases if (base / stale).is_dir()]
        group.kill()
        group.remove()
    return len(names)

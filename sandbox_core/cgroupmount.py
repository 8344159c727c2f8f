"""The cgroup2 mount's ``favordynmods`` option: the one host setting the project applies
itself (as root, when a local backend starts; ``doctor`` reports it)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from functools import cache
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"  # where root's tools come from


def cgroup2_mount() -> Path | None:
    """The cgroup2 hierarchy's mount point (pure v2 or hybrid), if any."""
    for candidate in (CGROUP_ROOT, CGROUP_ROOT / "unified"):
        if (candidate / "cgroup.procs").exists() and _mount_options(candidate) is not None:
            return candidate
    return None


def _mount_options(path: Path) -> set[str] | None:
    """The per-mount and per-superblock options of the cgroup2 mount at ``path``."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            fields = line.split()
            sep = fields.index("-")
            if fields[4] == str(path) and fields[sep + 1] == "cgroup2":
                return set(fields[5].split(",")) | set(fields[sep + 3].split(","))
    return None


def favors_dynmods() -> bool | None:
    """Whether cgroup2 is mounted with ``favordynmods``; None without a cgroup2 mount."""
    mount = cgroup2_mount()
    options = _mount_options(mount) if mount else None
    return None if options is None else "favordynmods" in options


@cache
def favor_dynmods() -> str | None:
    """Remount cgroup2 with ``favordynmods`` (once per process); None, or why it failed.

    Without it every write of a pid into cgroup.procs waits for an RCU grace period on
    the kernel's global cgroup_threadgroup_rwsem: ~8 ms per step on these hosts when the
    previous attach was more than ~30 ms earlier. With it, fork and exit take the rwsem's
    slower reader path instead (not measurable in the bare baselines of
    ops/bench/sandbox_overhead.py). Kernel >= 6.0; the option is host-wide.
    """
    mount = cgroup2_mount()
    if mount is None or os.geteuid() != 0:
        return "no cgroup2 mount" if mount is None else "not root"
    if favors_dynmods():
        return None
    # mount(8) keeps the mount's other options (a bare mount(2) MS_REMOUNT would reset
    # nosuid/nodev/noexec); found on a fixed system PATH, never the caller's
    tool = shutil.which("mount", path=SYSTEM_PATH)
    if tool is None:
        return f"no mount(8) on {SYSTEM_PATH}"
    done = subprocess.run(
        [tool, "-o", "remount,favordynmods", str(mount)],
        capture_output=True,
        text=True,
        check=False,
        env={"PATH": SYSTEM_PATH, "LC_ALL": "C"},
    )
    if done.returncode != 0 or not favors_dynmods():
        return (done.stderr.strip() or "the kernel ignored it") + f" ({mount})"
    return None

"""The memory all of a worker's jobs may hold together: the host's RAM less a reserve,
the limit of the farm's parent memory cgroup (cgroups.detect writes it)."""

from __future__ import annotations

import contextlib
from pathlib import Path

from sandbox_core import defaults as d

V1_UNLIMITED = 2**62  # cgroup v1 shows "no memory limit" as 2**63 - 1 rounded to pages


def mem_total() -> int | None:
    """The host's RAM in bytes (MemTotal of /proc/meminfo); None where it cannot be read."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * d.KIB
    return None


def farm_memory_limit() -> int | None:
    """Bytes all of a worker's jobs may hold together: the host's RAM less the reserve of
    defaults.FARM_MEMORY_RESERVE_*; None where the host's RAM is not known."""
    total = mem_total()
    if total is None:
        return None
    reserve = max(d.FARM_MEMORY_RESERVE_BYTES, int(total * d.FARM_MEMORY_RESERVE_SHARE))
    # whole MiB: v1 rounds a limit down to pages, and what is read back must match
    return (total - min(reserve, total // 2)) // d.MIB * d.MIB


def _read_limit(path: Path) -> int | None:
    """A memory limit file's value in bytes; None for no limit."""
    text = path.read_text().strip()
    value = None if text == "max" else int(text)
    return None if value is None or value >= V1_UNLIMITED else value


def bound_farm_memory(
    parent: Path | None, v2: bool, problems: list[str], limit: int | None
) -> int | None:
    """Limit the farm's parent memory group to ``limit`` (farm_memory_limit()), so jobs
    that together overcommit the host (their memory, their tmpfs files, which no process
    owns) are OOM-killed inside it, never a host service. Written only over none or a
    higher one (every process of a worker calls detect(); a lower one is the operator's).
    Returns the limit in force (None: none)."""
    if parent is None:
        return None
    path = parent / ("memory.max" if v2 else "memory.limit_in_bytes")
    current = None
    try:
        current = _read_limit(path)
        if limit is None:
            problems.append("no MemTotal in /proc/meminfo: jobs together are not bounded")
        elif current is None or current > limit:  # an operator's lower limit stands
            path.write_text(str(limit))
            current = limit
    except (OSError, ValueError) as exc:  # the worker runs on; doctor shows it
        why = exc.strerror if isinstance(exc, OSError) else str(exc)
        problems.append(f"{path}: {why}: jobs together are not bounded below the host's RAM")
    return current

"""A container's cgroup files as the host sees them: its pids and its OOM-kill count.

Read on the host, as root: nothing inside the container can fake or hide them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from sandbox_core.cgroupfiles import oom_file, read_oom_kills
from sandbox_core.cgroups import CGROUP_ROOT, TCP_LIMIT_V1, TCP_USAGE_V1, tcp_buffers_limit


class ContainerCgroup:
    def __init__(self, container_id: str) -> None:
        self.id = container_id

    def _files(self, controller: str, v1_name: str, v2_name: str) -> Iterator[Path]:
        """Where the engine may have put the file (cgroupfs or systemd driver, v1 or v2)."""
        cid = self.id
        yield CGROUP_ROOT / controller / "docker" / cid / v1_name
        yield CGROUP_ROOT / controller / "system.slice" / f"docker-{cid}.scope" / v1_name
        yield CGROUP_ROOT / "system.slice" / f"docker-{cid}.scope" / v2_name
        yield CGROUP_ROOT / "docker" / cid / v2_name

    def pids(self) -> list[int] | None:
        """Host pids in the container, or None where its cgroup is not found."""
        for path in self._files("pids", "cgroup.procs", "cgroup.procs"):
            with contextlib.suppress(OSError):
                return [int(pid) for pid in path.read_text().split()]
        return None

    def cpu_ns(self) -> int:
        """CPU time the container's processes have used, in nanoseconds (0 if unknown)."""
        with contextlib.suppress(OSError, ValueError):
            for path in self._files("cpuacct", "cpuacct.usage", "cpu.stat"):
                if not path.exists():
                    continue
                if path.name == "cpuacct.usage":
                    return int(path.read_text())
                for line in path.read_text().splitlines():
                    key, _, value = line.partition(" ")
                    if key == "usage_usec":
                        return int(value) * 1000
        return 0

    def bound_tcp_buffers(self, memory_bytes: int) -> None:
        """Cgroup v1 leaves socket buffers out of the container's memory limit until a TCP
        limit is set (defaults.TCP_BUFFERS_BYTES); v2 charges them to it already."""
        for path in self._files("memory", TCP_LIMIT_V1, TCP_LIMIT_V1):  # none on v2
            if path.exists():
                path.write_text(str(tcp_buffers_limit(memory_bytes)))
                return

    def tcp_bytes(self) -> int | None:
        """The container's TCP buffers now: v1's charge (None on v2, or once it is gone)."""
        for path in self._files("memory", TCP_USAGE_V1, TCP_USAGE_V1):
            with contextlib.suppress(OSError, ValueError):
                return int(path.read_bytes())
        return None

    def oom_kills(self) -> int:
        """The container's memory cgroup OOM-kill count."""
        for path in self._files("memory", oom_file(v2=False), oom_file(v2=True)):
            if path.exists():
                return read_oom_kills(path)
        return 0

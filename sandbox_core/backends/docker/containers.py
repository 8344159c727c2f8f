"""Containers of the Docker backend: what each is created with, who owns it, removal.

A container is read-only, has no network (unless the job may use it), no capabilities,
no new privileges, Docker's default seccomp profile, an init reaping zombies, and
pids/memory/CPU caps. A keeper process (uid 1001) holds it open; each step is a
`docker exec` as uid 1000, which therefore cannot signal the keeper. Every container is
labelled with its owner so a reaper can remove what a dead worker left behind.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandbox_core import defaults as d
from sandbox_core.backends.config import DockerConfig
from sandbox_core.models import Limits

JOB_UID = 1000
JOB_USER = f"{JOB_UID}:{JOB_UID}"
KEEPER_USER = "1001:1001"
WORKSPACE = "/workspace"
SCRIPTS = "/tmp/.sandfarm"
LABEL = "sandfarm.managed"
WORKSPACE_OWNER = "uid=1000,gid=1000,mode=0700"


def owner_labels(worker: str | None) -> dict[str, str]:
    return {
        LABEL: "1",
        "sandfarm.host": os.uname().nodename,
        "sandfarm.pid": str(os.getpid()),
        "sandfarm.worker": worker or f"{os.uname().nodename}:{os.getpid()}",
    }


@dataclass(frozen=True)
class Profile:
    """What a container is created with; jobs whose limits map to one share a warm pool."""

    image: str
    memory_mb: int
    processes: int
    cpu_s: int
    file_size_mb: int
    open_files: int
    network: bool
    workspace_mb: int

    @classmethod
    def for_job(cls, image: str, limits: Limits) -> Profile:
        return cls(
            image=image,
            memory_mb=limits.memory_mb,
            processes=limits.processes,
            cpu_s=limits.cpu_s,
            file_size_mb=limits.file_size_mb,
            open_files=limits.open_files,
            network=limits.network,
            workspace_mb=limits.workspace_mb,
        )


def create_container(
    client: Any, config: DockerConfig, profile: Profile, labels: dict[str, str]
) -> str:
    """Create and start a container for ``profile`` (never pulled: images are local);
    returns its id."""
    mib = d.MIB
    container = client.containers.run(
        profile.image,
        ["sleep", "infinity"],
        detach=True,
        init=True,
        user=KEEPER_USER,
        working_dir=WORKSPACE,
        read_only=True,
        tmpfs={
            WORKSPACE: f"rw,nosuid,nodev,size={profile.workspace_mb}m,exec,{WORKSPACE_OWNER}",
            "/tmp": "rw,nosuid,nodev,exec,size=64m,mode=1777",
        },
        network_mode="bridge" if profile.network else "none",
        cap_drop=["ALL"],
        security_opt=["no-new-privileges"],
        mem_limit=profile.memory_mb * mib,
        memswap_limit=profile.memory_mb * mib,
        pids_limit=profile.processes + 4,  # + init, keeper and our exec helpers
        nano_cpus=int(config.cpus * 1e9),
        ulimits=_ulimits(profile),
        runtime=config.runtime,
        labels=labels,
        environment={"HOME": WORKSPACE, "TMPDIR": "/tmp"},
    )
    return str(container.id)


def _ulimits(profile: Profile) -> list[Any]:
    from docker.types import Ulimit

    fsize = profile.file_size_mb * d.MIB
    return [
        Ulimit(name="nofile", soft=profile.open_files, hard=profile.open_files),
        Ulimit(name="fsize", soft=fsize, hard=fsize),
        Ulimit(name="core", soft=0, hard=0),
        Ulimit(name="cpu", soft=profile.cpu_s, hard=profile.cpu_s + 1),
    ]


def remove_container(client: Any, container_id: str) -> None:
    with contextlib.suppress(Exception):  # already gone, or the engine is going away
        client.api.remove_container(container_id, force=True)


def reap_orphans(client: Any) -> int:
    """Remove containers whose owning process on this host no longer exists."""
    host = os.uname().nodename
    removed = 0
    filters = {"label": [f"{LABEL}=1", f"sandfarm.host={host}"]}
    for info in client.api.containers(all=True, filters=filters):
        pid = int(info["Labels"].get("sandfarm.pid", "0") or 0)
        if pid and Path(f"/proc/{pid}").exists():
            continue
        remove_container(client, info["Id"])
        removed += 1
    return removed

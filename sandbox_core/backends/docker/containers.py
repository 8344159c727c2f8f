"""Containers of the Docker backend: what each is created with, who owns it, removal.

A container is read-only, has no network (unless the job may use it: jobnetwork.py), no
capabilities, no new privileges, the farm's seccomp allowlist (sandbox_core.seccomp), an
init reaping zombies, pids/memory/CPU caps, and a devpts instance of its own bounded by
the job's ``ptys``. A keeper process (KEEPER_UID) holds it open; each step is a `docker exec` as
the slot's uid in the Docker range (a warm container's first step: the exec armed ahead,
launcher.py), which is no host account, shared with no host job or other concurrent
job, and cannot signal the keeper.
Every container is labelled with a host-unique identity of its owner, so a reaper
anywhere on the host can tell a dead owner from a live one.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandbox_core import defaults as d
from sandbox_core import slots
from sandbox_core.backends.config import DockerConfig
from sandbox_core.backends.docker import jobnetwork
from sandbox_core.childsetup import in_own_thread, join_network_namespace, mount_devpts
from sandbox_core.loopback import configure_loopback
from sandbox_core.models import Limits
from sandbox_core.procid import boot_id, pid_namespace, start_time
from sandbox_core.seccomp import docker_profile
from sandbox_core.workspace import unmount

WORKSPACE = "/workspace"
SCRIPTS = "/tmp/.sandfarm"
LABEL = "sandfarm.managed"
PTS_LABEL = "sandfarm.pts"  # the host directory of the container's devpts instance


@dataclass(frozen=True)
class Owner:
    """Who owns a container, in terms that mean the same anywhere on the host: the boot,
    the pid namespace (a pid means nothing outside its namespace) and the process start
    time (pids are reused), plus the farm worker it serves, if any."""

    boot: str
    pidns: str
    pid: int
    start: str
    worker: str

    @classmethod
    def this_process(cls, worker: str | None) -> Owner:
        return cls(boot_id(), pid_namespace(), os.getpid(), start_time(os.getpid()), worker or "")

    def labels(self) -> dict[str, str]:
        return {
            LABEL: "1",
            "sandfarm.host": os.uname().nodename,
            "sandfarm.boot": self.boot,
            "sandfarm.pidns": self.pidns,
            "sandfarm.pid": str(self.pid),
            "sandfarm.start": self.start,
            "sandfarm.worker": self.worker,
        }


@dataclass(frozen=True)
class Profile:
    """What a container is created with; jobs whose limits map to one share a warm pool."""

    image: str
    memory_mb: int
    processes: int
    cpu_s: int
    cpus: float
    file_size_mb: int
    open_files: int
    network: bool
    workspace_mb: int
    ptys: int

    @classmethod
    def for_job(cls, image: str, limits: Limits) -> Profile:
        return cls(
            image=image,
            memory_mb=limits.memory_mb,
            processes=limits.processes,
            cpu_s=limits.cpu_s,
            cpus=limits.cpus,
            file_size_mb=limits.file_size_mb,
            open_files=limits.open_files,
            network=limits.network,
            workspace_mb=limits.workspace_mb,
            ptys=limits.ptys,
        )


def create_container(
    client: Any,
    config: DockerConfig,
    profile: Profile,
    uid: int,
    labels: dict[str, str],
    pts_base: Path,
) -> str:
    """Create and start a container for ``profile`` whose jobs run as ``uid`` (never
    pulled: images are local); returns its id."""
    from docker.types import Mount

    mib = d.MIB
    pts = _devpts(pts_base, profile.ptys)
    try:
        container = client.containers.run(
            profile.image,
            ["sleep", "infinity"],
            detach=True,
            init=True,
            user=f"{d.KEEPER_UID}:{d.KEEPER_UID}",
            working_dir=WORKSPACE,
            read_only=True,
            tmpfs={
                WORKSPACE: f"rw,nosuid,nodev,size={profile.workspace_mb}m,exec,"
                f"uid={uid},gid={uid},mode=0700",
                "/tmp": "rw,nosuid,nodev,exec,size=64m,mode=1777",
            },
            mounts=[] if pts is None else [Mount("/dev/pts", str(pts), type="bind")],
            network_mode=jobnetwork.NAME if profile.network else "none",  # see jobnetwork
            cap_drop=["ALL"],
            security_opt=["no-new-privileges", f"seccomp={docker_profile()}"],
            mem_limit=profile.memory_mb * mib,
            memswap_limit=profile.memory_mb * mib,
            # + init and keeper (the farm's helpers never run beside a step): the
            # container's exact bound. nproc counts the slot's docker uid host-wide, which
            # nothing else uses but the launchers armed in the slot's warm pool (one per
            # pooled container, launcher.py): it has room for those.
            pids_limit=profile.processes + 2,
            nano_cpus=int(profile.cpus * 1e9),
            ulimits=_ulimits(profile, config.warm_pool),
            runtime=config.runtime,
            labels={**labels, PTS_LABEL: str(pts or "")},
            environment={"HOME": WORKSPACE, "TMPDIR": "/tmp"},
            sysctls=_sysctls(profile),
        )
    except BaseException:
        if pts is not None:
            _remove_devpts(pts)
        raise
    return str(container.id)


def configure_container_loopback(container_id: str, pid: int) -> None:
    """Small packets on the loopback of the container whose init is ``pid`` (loopback.py),
    before any job process. A pidfd pins the process, then its cgroup must name the
    container: a pid reused since the engine named it is never joined."""
    pidfd = os.pidfd_open(pid)
    try:
        with open(f"/proc/{pid}/cgroup") as groups:
            if container_id not in groups.read():
                raise OSError(errno.ESRCH, f"pid {pid} is no longer {container_id[:12]}'s")

        def configure() -> None:
            join_network_namespace(pidfd)  # setns takes a pidfd
            configure_loopback()

        in_own_thread(configure)
    finally:
        os.close(pidfd)


def _sysctls(profile: Profile) -> dict[str, str]:
    """No ping sockets (the engine opens them to every gid: their queued replies are
    charged to no cgroup, ~8 MiB a socket, an attack review), and no IPv6 on the network
    jobs' bridge (its rules are IPv4's; engines from 26 give such containers link-local
    addresses again)."""
    sysctls = {"net.ipv4.ping_group_range": "1 0"}
    if profile.network:
        sysctls |= {f"net.ipv6.conf.{scope}.disable_ipv6": "1" for scope in ("all", "default")}
    return sysctls


def _devpts(base: Path, max_ptys: int) -> Path | None:
    """A devpts instance for one container, mounted on the host (root only): Docker's
    own has no bound, and the host's pty table is shared by everyone."""
    if os.geteuid() != 0:
        return None
    base.mkdir(mode=0o711, parents=True, exist_ok=True)
    # its owner in its name: one that died before its container named it (a label) is
    # found by that (reap_orphans)
    maker = f"{_pidns_inode()}-{os.getpid()}-{start_time(os.getpid())}"
    path = base / f"pts-{maker}-{secrets.token_hex(8)}"
    path.mkdir(mode=0o755)
    try:
        mount_devpts(str(path), max_ptys)
    except BaseException:
        path.rmdir()
        raise
    return path


def _remove_devpts(path: Path) -> None:
    unmount(str(path))
    with contextlib.suppress(OSError):
        path.rmdir()


def _ulimits(profile: Profile, armed_launchers: int) -> list[Any]:
    from docker.types import Ulimit

    fsize = profile.file_size_mb * d.MIB
    nproc = profile.processes + armed_launchers
    return [
        Ulimit(name="nofile", soft=profile.open_files, hard=profile.open_files),
        Ulimit(name="nproc", soft=nproc, hard=nproc),
        Ulimit(name="fsize", soft=fsize, hard=fsize),
        Ulimit(name="core", soft=0, hard=0),
        Ulimit(name="cpu", soft=profile.cpu_s, hard=profile.cpu_s + 1),
    ]


def remove_container(client: Any, container_id: str) -> None:
    pts = ""
    with contextlib.suppress(Exception):
        pts = client.api.inspect_container(container_id)["Config"]["Labels"].get(PTS_LABEL, "")
    with contextlib.suppress(Exception):  # already gone, or the engine is going away
        client.api.remove_container(container_id, force=True)
    if pts:
        _remove_devpts(Path(pts))


def pts_base(workspace_dir: Path | None) -> Path:
    """Where the containers' devpts instances are mounted on the host: under the
    workspace base, which the process backend hides from every job."""
    return slots.workspace_base(workspace_dir) / "docker-pts"


# -------------------------------------------------------------- reaping


# A judge of farm workers by their heartbeats: alive, dead, or None when it cannot tell.
WorkerAlive = Callable[[str], bool | None]


def owner_alive(labels: dict[str, str], worker_alive: WorkerAlive | None = None) -> bool | None:
    """Is a container's owner alive? None when this process cannot tell."""
    if labels.get("sandfarm.boot") not in (None, boot_id()):
        return False  # owned by a process of an earlier boot
    same_host = labels.get("sandfarm.host", os.uname().nodename) == os.uname().nodename
    same_pidns = labels.get("sandfarm.pidns", pid_namespace()) == pid_namespace()
    pid = int(labels.get("sandfarm.pid", "0") or 0)
    if same_host and same_pidns and pid:  # its pid means what it says here
        start, now_start = labels.get("sandfarm.start"), start_time(pid)
        return bool(now_start) and (start is None or start == now_start)
    if worker_alive is not None and labels.get("sandfarm.worker"):
        return worker_alive(labels["sandfarm.worker"])
    return None


def reap_orphans(
    client: Any, worker_alive: WorkerAlive | None = None, pts_dir: Path | None = None
) -> int:
    """Remove the farm's containers whose owner is known to be dead (never one whose
    owner this process cannot judge); returns how many. ``worker_alive``: a judge of
    farm workers by their heartbeats, for containers a worker owns. ``pts_dir``: also
    unmount the devpts instances there that no container names and whose maker died."""
    removed, named = 0, set()
    for info in client.api.containers(all=True, filters={"label": [f"{LABEL}=1"]}):
        labels = info.get("Labels") or {}
        if owner_alive(labels, worker_alive) is False:
            remove_container(client, info["Id"])
            removed += 1
        else:
            named.add(labels.get(PTS_LABEL, ""))
    if pts_dir is not None and pts_dir.is_dir():
        for path in pts_dir.glob("pts-*"):
            if str(path) not in named and _maker_dead(path.name):
                _remove_devpts(path)
    return removed


def _maker_dead(name: str) -> bool:
    """Whether the process that made devpts directory ``name`` (pts-PIDNS-PID-START-TOKEN)
    is gone; False where this process cannot judge: a maker of another pid namespace (its
    pid means nothing here), or a name of another form."""
    parts = name.split("-")
    if len(parts) != 5 or parts[1] != _pidns_inode() or not parts[2].isdigit():
        return False
    return start_time(int(parts[2])) != parts[3]


def _pidns_inode() -> str:
    """This process's pid namespace, as a name part: pid:[4026531836] -> 4026531836."""
    return pid_namespace().removeprefix("pid:[").removesuffix("]") or "0"

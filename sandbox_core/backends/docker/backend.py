"""L3: one ephemeral container per job (Docker SDK), optionally taken from a warm pool.

The engine is asked what it offers (version, runtimes, images) once per backend and
again only after an engine error, never per job.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from sandbox_core import defaults as d
from sandbox_core import slots
from sandbox_core.backends import prewarm
from sandbox_core.backends.base import Backend, Protection
from sandbox_core.backends.config import DockerConfig
from sandbox_core.backends.docker.containers import (
    Owner,
    Profile,
    configure_container_loopback,
    create_container,
    pts_base,
    reap_orphans,
    remove_container,
)
from sandbox_core.backends.docker.jobnetwork import job_network
from sandbox_core.backends.docker.launcher import arm
from sandbox_core.backends.docker.pool import Remover, WarmContainer, WarmPool
from sandbox_core.backends.docker.session import DockerSession
from sandbox_core.errors import BackendUnavailableError, ProtectionUnavailableError
from sandbox_core.models import JobSpec, Limits
from sandbox_core.procevents import ExitWatcher
from sandbox_core.seccomp import docker_profile

# Where the worker is not root (no slot uids): every job runs as this one uid.
UNPRIVILEGED_JOB_UID = 1000


@dataclass(frozen=True)
class EngineProbe:
    """What the engine said when asked: its version, runtimes and local image tags."""

    version: str
    runtimes: tuple[str, ...]
    images: frozenset[str]


class DockerBackend(Backend):
    name = "docker"

    def __init__(self, config: DockerConfig) -> None:
        super().__init__(config)
        self.config = config
        self.image = config.image
        self.allowed_images = config.images
        self.labels = Owner.this_process(config.worker).labels()
        self.slots = slots.SlotPool(config.slot, None)
        self.exits = ExitWatcher.shared()  # the kernel's word on each exec's end
        self._pools: dict[tuple[Profile, int], WarmPool] = {}
        self._remover = Remover(self._remove)
        self._lock = threading.Lock()
        self._probe: EngineProbe | None = None

    @cached_property
    def client(self) -> Any:
        host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
        try:
            import docker

            client = docker.from_env(timeout=30)
            client.ping()
        except Exception as exc:  # the SDK raises several unrelated types here
            raise BackendUnavailableError(
                f"no Docker engine at {host} ({_engine_cause(exc)});"
                " start one with ops/install_docker.sh"
            ) from None
        reap_orphans(client)
        return client

    def ensure_available(self) -> None:
        self.probe()

    # --- protections ----------------------------------------------------------------

    def probe(self, fresh: bool = False) -> EngineProbe:
        """The engine's answer, asked once (again with ``fresh``, after an engine error)."""
        if self._probe is None or fresh:
            info = self.client.info()
            tags = {tag for image in self.client.images.list() for tag in image.tags if tag}
            self._probe = EngineProbe(
                version=str(info.get("ServerVersion")),
                runtimes=tuple(sorted(info.get("Runtimes", {}))),
                images=frozenset(tags),
            )
        return self._probe

    def protections(self) -> list[Protection]:
        try:
            probe = self.probe()
        except BackendUnavailableError as exc:
            reason = str(exc)
            return [
                Protection(name, False, reason)
                for name in ("tree_kill", "uid_isolation", "network_isolation")
            ]
        has_image = self.image in probe.images
        runtime_ok = self.config.runtime in probe.runtimes
        clash = slots.uid_range_problem() if os.geteuid() == 0 else "not root: one uid for all"
        honest = self.exits is not None and self.config.runtime == "runc"
        seccomp = json.loads(docker_profile())
        return [
            Protection("engine", True, f"Docker {probe.version}"),
            Protection(
                "runtime",
                runtime_ok,
                f"{self.config.runtime} (engine has: {', '.join(probe.runtimes)})",
            ),
            Protection("image", has_image, f"{self.image}" + ("" if has_image else " missing")),
            Protection("tree_kill", True, "container removed after every job"),
            Protection(
                "uid_isolation",
                clash is None,
                "each slot's jobs run as its own uid (no host account), no capabilities"
                if clash is None
                else clash,
            ),
            Protection("network_isolation", True, "network none"),
            Protection("filesystem_isolation", True, "read-only image, tmpfs workspace"),
            Protection(
                "syscall_filter",
                True,
                f"the farm's seccomp allowlist ({len(seccomp['syscalls'])} rules),"
                " no-new-privileges",
            ),
            Protection(
                "private_ptys",
                os.geteuid() == 0,
                "a devpts instance per container, at most limits.ptys"
                if os.geteuid() == 0
                else "not root: Docker's own devpts, unbounded",
            ),
            Protection(
                "honest_status",
                honest,
                "each exec's real wait status from the kernel (proc connector)"
                if honest
                else ExitWatcher.why_unavailable()
                or f"runtime {self.config.runtime}: exit 128+N reads as signal N",
            ),
        ]

    def required_protections(self, spec: JobSpec) -> list[str]:
        return [*super().required_protections(spec), "syscall_filter"]

    def check(self, spec: JobSpec) -> None:
        super().check(spec)
        image = spec.image or self.image
        if image not in self.allowed_images:
            raise ProtectionUnavailableError(
                "image", f"{image!r} is not in the allowed images {list(self.allowed_images)}"
            )
        self.client  # noqa: B018 - raises BackendUnavailableError when no engine answers
        if spec.limits.network:  # refused where its bridge's isolation cannot be had
            job_network(self.client)

    # --- containers -----------------------------------------------------------------

    def create(self, profile: Profile, uid: int, job_id: str | None = None) -> str:
        labels = {**self.labels, "sandfarm.job": job_id or "-"}
        base = pts_base(self.config.workspace_dir)
        try:
            container_id = create_container(self.client, self.config, profile, uid, labels, base)
        except Exception:
            self._probe = None  # the engine changed under us (image, runtime): ask again
            raise
        if "runsc" not in self.config.runtime:  # gVisor's jobs use its own network stack
            try:  # before any job process: small packets on its loopback (loopback.py)
                info = self.client.api.inspect_container(container_id)
                configure_container_loopback(container_id, info["State"]["Pid"])
            except BaseException:
                self.remove_later(container_id)
                raise
        return container_id

    def _remove(self, container_id: str) -> None:
        remove_container(self.client, container_id)

    def take_container(
        self, profile: Profile, slot: slots.Slot, job_id: str | None
    ) -> WarmContainer:
        uid = slot_uid(slot)
        if self.config.warm_pool > 0 and profile == self.default_profile:
            container = self._pool(profile, slot).take()
            if container is not None:
                return container
        return WarmContainer(self.create(profile, uid, job_id))

    def _create_warm(self, profile: Profile, uid: int) -> WarmContainer:
        """A pool's container, its first step's launcher armed (see launcher.py) under
        runc, the runtime it is tested on (Debian's runsc loses its sentry on it here)."""
        container_id = self.create(profile, uid, "pool")
        if self.config.runtime != "runc":
            return WarmContainer(container_id)
        return WarmContainer(container_id, arm(self.client.api, container_id, uid))

    def _remove_warm(self, container: WarmContainer) -> None:
        if container.launcher is not None:
            container.launcher.close()
        self._remove(container.id)

    @cached_property
    def default_profile(self) -> Profile:
        return Profile.for_job(self.image, Limits())

    def _pool(self, profile: Profile, slot: slots.Slot) -> WarmPool:
        """The warm pool of ``profile`` for ``slot``: its containers run jobs as its uid."""
        uid = slot_uid(slot)
        with self._lock:
            key = (profile, slot.index)
            if key not in self._pools:
                self._pools[key] = WarmPool(
                    profile,
                    self.config.warm_pool,
                    lambda p: self._create_warm(p, uid),
                    self._remove_warm,
                )
            return self._pools[key]

    def start_pool(self, wait_s: float = 0.0) -> bool:
        """Fill the warm pool of the default profile now (else on first use); with
        ``wait_s``, wait until it is full. True when the pool is full."""
        if self.config.warm_pool <= 0:
            return False
        with self.slots.borrow() as slot:
            pool = self._pool(self.default_profile, slot)
        return pool.wait_ready(wait_s) if wait_s else False

    def remove_later(self, container_id: str) -> None:
        """Remove off the job's critical path; close() waits for every removal."""
        self._remover.later(container_id)

    def close(self) -> None:
        """Remove every container this backend started (its pools too) before returning:
        nothing of a job outlives the process that ran it."""
        for pool in list(self._pools.values()):
            pool.close()
        self._pools.clear()
        self._remover.close()
        self.slots.close()

    @contextlib.contextmanager
    def open_session(self, spec: JobSpec) -> Iterator[DockerSession]:
        profile = Profile.for_job(spec.image or self.image, spec.limits)
        prewarm.vacate(self.slots.index)  # a local backend's standby shares no slot with us
        with self.slots.borrow() as slot:
            container = self.take_container(profile, slot, spec.id)
            session = DockerSession(self, spec, container.id, slot_uid(slot), container.launcher)
            try:
                yield session
            finally:
                session.close()


def _engine_cause(exc: Exception) -> str:
    text = str(exc)
    for needle, plain in (
        ("No such file or directory", "no such socket"),
        ("Connection refused", "connection refused"),
        ("Permission denied", "permission denied on the socket"),
        ("Read timed out", "no answer"),
    ):
        if needle in text:
            return plain
    return text.splitlines()[0][:200] if text else type(exc).__name__


def slot_uid(slot: slots.Slot) -> int:
    """The uid a slot's container jobs run as: the slot's in the Docker range, which no
    host backend's job shares (one for all where the worker is not root)."""
    return d.DOCKER_UID_BASE + slot.index if slot.uid is not None else UNPRIVILEGED_JOB_UID

"""L3: one ephemeral container per job (Docker SDK), optionally taken from a warm pool.

The container is read-only, has no network (unless the job may use it), no
capabilities, no new privileges, Docker's default seccomp profile, an init reaping
zombies, and pids/memory/CPU caps. A keeper process (uid 1001) holds it open; each step
is a `docker exec` as uid 1000, which therefore cannot signal the keeper. Files go in and
out as bounded tar streams over exec (the archive API cannot reach a tmpfs workspace
under a read-only root). Every container is labelled with its owner so a reaper can
remove what a dead worker left behind.
"""

from __future__ import annotations

import contextlib
import fnmatch
import io
import os
import queue
import selectors
import socket
import struct
import tarfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from sandbox_core import defaults as d
from sandbox_core.backends.base import (
    PYTHON_BOOTSTRAP,
    PYTHON_INLINE_BOOTSTRAP,
    Backend,
    Protection,
    Session,
)
from sandbox_core.errors import BackendUnavailableError, ProtectionUnavailableError
from sandbox_core.isolation import process_uids_of
from sandbox_core.models import CollectedFile, ExecStep, JobSpec, Limits, PythonStep
from sandbox_core.output import HeadTailBuffer
from sandbox_core.runner import ExecOutcome
from sandbox_core.workspace import encode_collected

DEFAULT_IMAGE = "sandfarm/sandbox:latest"
JOB_UID = 1000
JOB_USER = f"{JOB_UID}:{JOB_UID}"
KEEPER_USER = "1001:1001"
WORKSPACE = "/workspace"
SCRIPTS = "/tmp/.sandfarm"
LABEL = "sandfarm.managed"
MAX_LISTED_FILES = 10_000
WORKSPACE_OWNER = "uid=1000,gid=1000,mode=0700"
INLINE_SOURCE_BYTES = 64 * 1024  # below Linux's 128 KiB limit on one exec argument

# Kill every process of the job's uid except this shell itself: the keeper runs as
# another uid, so the container survives for the next step.
_KILL_JOB_PROCESSES = "kill -9 -1 2>/dev/null; true"


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


class DockerBackend(Backend):
    name = "docker"

    def __init__(
        self,
        *,
        image: str = DEFAULT_IMAGE,
        allowed_images: tuple[str, ...] | None = None,
        runtime: str = "runc",
        cpus: float = 1.0,
        warm_pool: int = 0,
        allow_weaker: bool = False,
        allow_network: bool = False,
        worker: str | None = None,
        **_ignored: object,  # options meant for host backends (slot, python, ...)
    ) -> None:
        super().__init__(allow_weaker=allow_weaker, allow_network=allow_network, worker=worker)
        self.image = image
        self.allowed_images = allowed_images or (image,)
        self.runtime = runtime
        self.cpus = cpus
        self.labels = owner_labels(worker)
        self._pool_size = warm_pool
        self._pools: dict[Profile, WarmPool] = {}
        self._removals: queue.Queue[str | None] = queue.Queue()
        self._remover: threading.Thread | None = None
        self._lock = threading.Lock()

    @cached_property
    def client(self):
        try:
            import docker

            client = docker.from_env(timeout=30)
            client.ping()
        except Exception as exc:  # the SDK raises several unrelated types here
            raise BackendUnavailableError(f"no Docker engine answers: {exc}") from None
        reap_orphans(client)
        return client

    # --- protections ----------------------------------------------------------------

    def protections(self) -> list[Protection]:
        try:
            info = self.client.info()
        except BackendUnavailableError as exc:
            reason = str(exc)
            return [
                Protection(name, False, reason)
                for name in ("tree_kill", "uid_isolation", "network_isolation")
            ]
        runtimes = sorted(info.get("Runtimes", {}))
        images = sorted(tag for image in self.client.images.list() for tag in image.tags if tag)
        has_image = self.image in images
        runtime_ok = self.runtime in runtimes
        return [
            Protection("engine", True, f"Docker {info.get('ServerVersion')}"),
            Protection(
                "runtime",
                runtime_ok,
                f"{self.runtime} (engine has: {', '.join(runtimes)})",
            ),
            Protection("image", has_image, f"{self.image}" + ("" if has_image else " missing")),
            Protection("tree_kill", True, "container removed after every job"),
            Protection("uid_isolation", True, f"job runs as uid {JOB_USER}, no capabilities"),
            Protection("network_isolation", True, "network none"),
            Protection("filesystem_isolation", True, "read-only image, tmpfs workspace"),
            Protection("seccomp", True, "Docker's default profile, no-new-privileges"),
        ]

    def check(self, spec: JobSpec) -> None:
        super().check(spec)
        image = spec.image or self.image
        if image not in self.allowed_images:
            raise ProtectionUnavailableError(
                "image", f"{image!r} is not in the allowed images {list(self.allowed_images)}"
            )
        self.client  # noqa: B018 - raises BackendUnavailableError when no engine answers

    # --- containers -----------------------------------------------------------------

    def create_container(self, profile: Profile, job_id: str | None = None) -> str:
        """Create and start a container for ``profile`` (never pulled: images are local);
        returns its id."""
        labels = {**self.labels, "sandfarm.job": job_id or "-"}
        mib = d.MIB
        return self.client.containers.run(
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
            nano_cpus=int(self.cpus * 1e9),
            ulimits=_ulimits(profile),
            runtime=self.runtime,
            labels=labels,
            environment={"HOME": WORKSPACE, "TMPDIR": "/tmp"},
        ).id

    def take_container(self, profile: Profile, job_id: str | None) -> str:
        if self._pool_size > 0 and profile == self.default_profile:
            pool = self._pool(profile)
            container = pool.take()
            if container is not None:
                return container
        return self.create_container(profile, job_id)

    @cached_property
    def default_profile(self) -> Profile:
        return Profile.for_job(self.image, Limits())

    def _pool(self, profile: Profile) -> WarmPool:
        with self._lock:
            if profile not in self._pools:
                self._pools[profile] = WarmPool(self, profile, self._pool_size)
            return self._pools[profile]

    def start_pool(self, wait_s: float = 0.0) -> bool:
        """Fill the warm pool of the default profile now (else on first use); with
        ``wait_s``, wait until it is full. True when the pool is full."""
        if self._pool_size <= 0:
            return False
        pool = self._pool(self.default_profile)
        return pool.wait_ready(wait_s) if wait_s else False

    def remove_later(self, container_id: str) -> None:
        """Remove off the job's critical path; close() waits for every removal."""
        with self._lock:
            if self._remover is None:
                self._remover = threading.Thread(target=self._remove_loop, daemon=True)
                self._remover.start()
        self._removals.put(container_id)

    def _remove_loop(self) -> None:
        while (container_id := self._removals.get()) is not None:
            remove_container(self.client, container_id)
            self._removals.task_done()
        self._removals.task_done()

    def close(self) -> None:
        for pool in list(self._pools.values()):
            pool.close()
        if self._remover is not None:
            self._removals.put(None)
            self._remover.join(timeout=120)
            self._remover = None

    @contextlib.contextmanager
    def open_session(self, spec: JobSpec) -> Iterator[DockerSession]:
        profile = Profile.for_job(spec.image or self.image, spec.limits)
        session = DockerSession(self, spec, self.take_container(profile, spec.id))
        try:
            yield session
        finally:
            session.close()


def _ulimits(profile: Profile) -> list:
    from docker.types import Ulimit

    fsize = profile.file_size_mb * d.MIB
    return [
        Ulimit(name="nofile", soft=profile.open_files, hard=profile.open_files),
        Ulimit(name="fsize", soft=fsize, hard=fsize),
        Ulimit(name="core", soft=0, hard=0),
        Ulimit(name="cpu", soft=profile.cpu_s, hard=profile.cpu_s + 1),
    ]


def remove_container(client, container_id: str) -> None:
    with contextlib.suppress(Exception):  # already gone, or the engine is going away
        client.api.remove_container(container_id, force=True)


def reap_orphans(client) -> int:
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


class WarmPool:
    """Started containers for one profile, each used by exactly one job, refilled behind."""

    def __init__(self, backend: DockerBackend, profile: Profile, size: int) -> None:
        self.backend = backend
        self.profile = profile
        self.size = size
        self._ready: queue.Queue[str] = queue.Queue()
        self._wanted = threading.Semaphore(0)
        self._closed = threading.Event()
        for _ in range(size):
            self._wanted.release()
        self._filler = threading.Thread(target=self._fill, daemon=True, name="sandfarm-pool")
        self._filler.start()

    def _fill(self) -> None:
        while not self._closed.is_set():
            if not self._wanted.acquire(timeout=0.5):
                continue
            try:
                container = self.backend.create_container(self.profile, "pool")
            except Exception:  # engine hiccup: try again shortly, never crash the worker
                self._wanted.release()
                time.sleep(1)
                continue
            if self._closed.is_set():
                remove_container(self.backend.client, container)
                return
            self._ready.put(container)

    def wait_ready(self, timeout_s: float = 60.0) -> bool:
        """Block until the pool holds ``size`` started containers (for benchmarks, tests)."""
        deadline = time.monotonic() + timeout_s
        while self._ready.qsize() < self.size:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    def take(self) -> str | None:
        try:
            container_id = self._ready.get_nowait()
        except queue.Empty:
            return None
        self._wanted.release()  # refill in the background
        return container_id

    def close(self) -> None:
        self._closed.set()
        self._filler.join(timeout=60)
        while True:
            try:
                remove_container(self.backend.client, self._ready.get_nowait())
            except queue.Empty:
                return


class DockerSession(Session):
    def __init__(self, backend: DockerBackend, spec: JobSpec, container_id: str) -> None:
        self.backend = backend
        self.spec = spec
        self.id = container_id
        self.api = backend.client.api
        self.dead = False
        self.dirty = False  # a step ran since the last sweep

    # --- exec plumbing --------------------------------------------------------------

    def _exec(
        self,
        argv: list[str],
        *,
        stdin: bytes | None,
        limits: Limits,
        deadline: float,
        cancel: threading.Event | None = None,
        user: str = JOB_USER,
        env: dict[str, str] | None = None,
    ) -> tuple[ExecOutcome, str]:
        out = ExecOutcome(
            stdout=HeadTailBuffer(limits.output_bytes, limits.head_ratio),
            stderr=HeadTailBuffer(limits.output_bytes, limits.head_ratio),
        )
        started = time.monotonic()
        exec_id = self.api.exec_create(
            self.id,
            argv,
            stdin=stdin is not None,
            user=user,
            workdir=WORKSPACE,
            environment=env,
        )["Id"]
        raw = self.api.exec_start(exec_id, socket=True)._sock
        try:
            if stdin is not None:
                with contextlib.suppress(OSError):
                    raw.sendall(stdin)
                with contextlib.suppress(OSError):
                    raw.shutdown(socket.SHUT_WR)
            self._pump(raw, exec_id, out, limits, deadline, cancel)
        finally:
            # first: the engine blocks a kill for 10 s while our socket has unread output
            with contextlib.suppress(OSError):
                raw.shutdown(socket.SHUT_RDWR)
            raw.close()
        if out.timed_out or out.flooded or out.cancelled:
            self.kill()
        out.duration_ms = (time.monotonic() - started) * 1000
        if self.dead:
            out.signal = 9
            return out, exec_id
        try:
            code = self.api.exec_inspect(exec_id).get("ExitCode")
        except Exception:  # the container died under the exec (OOM-killed keeper, ...)
            self.dead = True
            code = None
        if code is None:
            out.signal = 9
            return out, exec_id
        if code is not None and 128 < code <= 128 + 64:  # the engine reports signals as 128+n
            out.signal = code - 128
        else:
            out.exit_code = code
        return out, exec_id

    def _pump(
        self,
        raw: socket.socket,
        exec_id: str,
        out: ExecOutcome,
        limits: Limits,
        deadline: float,
        cancel: threading.Event | None,
    ) -> None:
        """Demultiplex Docker's framed stream into the two head+tail buffers.

        The stream normally ends when the process exits; where a runtime keeps it open
        while a leftover holds the pipe (gVisor), the exec's state is polled instead and
        leftovers get EXIT_DRAIN_S to finish writing, as on the host backends.
        """
        sel = selectors.DefaultSelector()
        sel.register(raw, selectors.EVENT_READ)
        pending = bytearray()
        streams = {1: out.stdout, 2: out.stderr}
        next_poll = time.monotonic() + 0.25
        drain_until: float | None = None
        try:
            while True:
                now = time.monotonic()
                if drain_until is not None and now >= drain_until:
                    return
                if now >= deadline:
                    out.timed_out = True
                    return
                if cancel is not None and cancel.is_set():
                    out.cancelled = True
                    return
                if drain_until is None and now >= next_poll:
                    next_poll = now + 0.25
                    with contextlib.suppress(Exception):
                        if not self.api.exec_inspect(exec_id).get("Running", True):
                            drain_until = now + d.EXIT_DRAIN_S
                if not sel.select(min(deadline, next_poll, drain_until or deadline) - now):
                    continue
                chunk = raw.recv(1 << 16)
                if not chunk:
                    return
                pending += chunk
                while len(pending) >= 8:
                    kind, size = pending[0], struct.unpack(">I", pending[4:8])[0]
                    if len(pending) < 8 + size:
                        break
                    if kind in streams:
                        streams[kind].write(memoryview(pending)[8 : 8 + size])
                    del pending[: 8 + size]
                if out.stdout.total + out.stderr.total > limits.flood_kill_bytes:
                    out.flooded = True
                    return
        finally:
            sel.close()

    def _helper(self, argv: list[str], stdin: bytes | None = None, budget: int = d.MIB) -> bytes:
        """Run a farm-side helper command as the job user; returns its stdout (bounded)."""
        limits = Limits(output_bytes=min(max(budget, 64), d.OUTPUT_BYTES[1]), head_ratio=1.0)
        outcome, _ = self._exec(argv, stdin=stdin, limits=limits, deadline=time.monotonic() + 60)
        if outcome.exit_code != 0:
            raise OSError(
                f"{argv[0]} in the container failed: {outcome.stderr.text()[-300:].strip()}"
            )
        return outcome.stdout.head

    # --- Session --------------------------------------------------------------------

    @property
    def alive(self) -> bool:
        return not self.dead

    def write_file(self, path: str, content: bytes) -> None:
        self._put_files({path: content})

    def write_files(self, files: dict[str, bytes]) -> None:
        if files:
            self._put_files(files)  # one tar stream, one exec

    def _put_files(self, files: dict[str, bytes], root: str = WORKSPACE) -> None:
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            for path, content in files.items():
                info = tarfile.TarInfo(path)
                info.size, info.mode, info.uid, info.gid = len(content), 0o644, 1000, 1000
                tar.addfile(info, io.BytesIO(content))
        # tar refuses members that leave the directory and does not follow symlinks for
        # the final component unless told; --no-overwrite-dir keeps workspace modes.
        self._helper(
            ["tar", "-x", "--no-same-owner", "--no-overwrite-dir", "-C", root, "-f", "-"],
            stdin=buffer.getvalue(),
        )

    def _sweep(self) -> None:
        """Kill what the last step left running before the farm touches the files.

        From the host, as root, by pid (the container's cgroup, the job's uid): inside the
        container a leftover of the same uid could kill the sweeper itself."""
        if self.dirty and not self.dead:
            procs = self._cgroup_procs()
            if procs is None:  # unknown cgroup layout: sweep from inside, as the job's uid
                self._helper(["sh", "-c", _KILL_JOB_PROCESSES])
            else:
                for _ in range(50):  # a fork bomb races us; the pids cap bounds the race
                    victims = [p for p in procs if process_uids_of([p]).get(p) == JOB_UID]
                    if not victims:
                        break
                    for pid in victims:
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, 9)
                    procs = self._cgroup_procs() or []
        self.dirty = False

    def _cgroup_procs(self) -> list[int] | None:
        """Host pids in the container's cgroup, or None where its cgroup is not found."""
        for path in self._cgroup_files("pids", "cgroup.procs", "cgroup.procs"):
            with contextlib.suppress(OSError):
                return [int(pid) for pid in path.read_text().split()]
        return None

    def _cgroup_files(self, controller: str, v1_name: str, v2_name: str) -> Iterator[Path]:
        """Where the engine may have put the container's cgroup file (cgroupfs or systemd
        driver, cgroup v1 or v2)."""
        root, cid = Path("/sys/fs/cgroup"), self.id
        yield root / controller / "docker" / cid / v1_name
        yield root / controller / "system.slice" / f"docker-{cid}.scope" / v1_name
        yield root / "system.slice" / f"docker-{cid}.scope" / v2_name
        yield root / "docker" / cid / v2_name

    def _head(self, path: str, count: int) -> bytes:
        if count <= 0:
            return b""
        return self._helper(["head", "-c", str(count), "--", path], budget=count)

    def _whole_files(self, paths: list[str], sizes: dict[str, int]) -> dict[str, bytes]:
        """Regular files among ``paths``, whole, in one tar stream sized from the listing."""
        if not paths:
            return {}
        budget = sum(sizes[p] for p in paths) + 2048 * (len(paths) + 4) + 10240
        # Names go NUL-separated on stdin, verbatim: never parsed as options or escapes.
        names = b"".join(p.encode("utf-8", "surrogateescape") + b"\0" for p in paths)
        data = self._helper(
            ["tar", "-c", "-f", "-", "--null", "--verbatim-files-from", "-T", "-"],
            stdin=names,
            budget=budget,
        )
        found: dict[str, bytes] = {}
        try:
            with tarfile.open(fileobj=io.BytesIO(data), mode="r|") as tar:
                for info in tar:
                    handle = tar.extractfile(info) if info.isreg() else None
                    if handle is not None:
                        found[info.name.removeprefix("./")] = handle.read()
        except tarfile.TarError:
            pass  # keep what was read; the rest is reported omitted
        return found

    def read_into(self, path: str, buffer: HeadTailBuffer) -> None:
        self._sweep()
        path = os.path.normpath(path)
        size = self._list_files().get(path)
        if size is None:
            raise FileNotFoundError(f"{path} is not a regular file in the workspace")
        head = self._head(path, min(size, buffer.head_limit))
        buffer.write(head)
        rest = size - len(head)
        if rest > 0:  # the tail separately, bounded; what lies between is only counted
            want = min(rest, buffer.tail_limit)
            tail = self._helper(["tail", "-c", str(want), "--", path], budget=want)
            buffer.total += rest - len(tail)
            buffer.write(tail)

    def _list_files(self) -> dict[str, int]:
        """Regular files of the workspace -> size; NUL-separated, so any name survives."""
        raw = self._helper(["find", ".", "-type", "f", "-printf", "%s\\t%P\\0"], budget=4 * d.MIB)
        files: dict[str, int] = {}
        for record in raw.split(b"\0")[:MAX_LISTED_FILES]:
            size, _, name = record.partition(b"\t")
            if name and size.isdigit():
                files[name.decode("utf-8", "surrogateescape")] = int(size)
        return files

    def collect(self, patterns: list[str]) -> tuple[list[CollectedFile], int]:
        if not patterns or self.dead:
            return [], 0
        self._sweep()
        sizes = self._list_files()
        matching = [
            name
            for name in sorted(sizes)
            if any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)
        ]
        # Plan from the listed sizes: whole files in one tar, the odd large one by head -c.
        budget = d.COLLECT_MAX_TOTAL_BYTES
        whole, partial, omitted = [], [], 0
        for name in matching:
            limit = min(d.COLLECT_MAX_FILE_BYTES, budget)
            if len(whole) + len(partial) >= d.COLLECT_MAX_FILES or limit <= 0:
                omitted += 1
            elif sizes[name] <= limit:
                whole.append(name)
                budget -= sizes[name]
            else:
                partial.append((name, limit))
                budget -= limit
        contents = self._whole_files(whole, sizes)
        for name, limit in partial:
            contents[name] = self._head(name, limit)
        collected = [
            encode_collected(name, sizes[name], contents[name], len(contents[name]) or 1)
            for name in sorted(contents)
            if name in sizes
        ]
        return collected, omitted + len(whole) + len(partial) - len(collected)

    def exec(
        self, step: ExecStep, index: int, deadline: float, cancel: threading.Event | None
    ) -> tuple[ExecOutcome, bool]:
        if self.dead:
            raise OSError("the container is gone")
        self._sweep()  # nothing a step started outlives it, as on every backend
        self.dirty = True
        source = step.code if isinstance(step, PythonStep) else step.command
        if len(source.encode()) <= INLINE_SOURCE_BYTES:  # saves an exec per step
            argv = (
                ["python3", "-I", "-c", PYTHON_INLINE_BOOTSTRAP, source]
                if isinstance(step, PythonStep)
                else ["bash", "--noprofile", "--norc", "-c", source]
            )
        else:  # past the kernel's per-argument limit: through a file
            script = f"{SCRIPTS}/step-{index}"
            self._put_files({f".sandfarm/step-{index}": source.encode()}, root="/tmp")
            argv = (
                ["python3", "-I", "-c", PYTHON_BOOTSTRAP, script]
                if isinstance(step, PythonStep)
                else ["bash", "--noprofile", "--norc", script]
            )
        if step.stdin is not None:
            argv = ["sh", "-c", 'exec "$@" < /dev/stdin', "sh", *argv]
        env = {
            "PATH": d.SANDBOX_PATH,
            "HOME": WORKSPACE,
            "TMPDIR": "/tmp",
            "LANG": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONUNBUFFERED": "1",
            **self.spec.env,
        }
        ooms_before = self.oom_kills()
        outcome, _ = self._exec(
            argv,
            stdin=step.stdin.encode() if step.stdin is not None else None,
            limits=self.spec.limits,
            deadline=deadline,
            cancel=cancel,
            env=env,
        )
        memory_hit = self.oom_kills() > ooms_before or self._oom_killed_state()
        return outcome, memory_hit

    def oom_kills(self) -> int:
        """The container's memory cgroup OOM-kill count, read on the host."""
        for path in self._cgroup_files("memory", "memory.oom_control", "memory.events"):
            with contextlib.suppress(OSError):
                for line in path.read_text().splitlines():
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        return 0

    def _oom_killed_state(self) -> bool:
        if not self.dead:
            return False
        with contextlib.suppress(Exception):
            return bool(self.api.inspect_container(self.id)["State"].get("OOMKilled"))
        return False

    def kill(self) -> None:
        """End the job now: the container and everything in it."""
        self.dead = True
        with contextlib.suppress(Exception):
            self.api.kill(self.id)

    def close(self) -> None:
        self.dead = True
        self.backend.remove_later(self.id)

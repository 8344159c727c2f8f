"""One job's container: each step a `docker exec` supervised like a host process (a warm
container's first step through its armed launcher), files through bounded helper
commands, leftovers swept from the host between steps."""

from __future__ import annotations

import contextlib
import os
import selectors
import socket
import threading
import time
from typing import TYPE_CHECKING, Any

from sandbox_core import defaults as d
from sandbox_core.backends.base import Session
from sandbox_core.backends.docker.containers import SCRIPTS, WORKSPACE
from sandbox_core.backends.docker.hostcgroup import ContainerCgroup
from sandbox_core.backends.docker.launcher import (
    EXEC_INLINE_BYTES,
    Launcher,
    LauncherGone,
    arm,
    exec_payload_bytes,
    feed_stdin,
)
from sandbox_core.backends.docker.stream import STDERR, STDOUT, FrameDemux
from sandbox_core.backends.docker.transfer import FileTransfer
from sandbox_core.backends.steps import clean_environment, inline_argv, script_argv, source_of
from sandbox_core.cgroups import tcp_buffers_limit
from sandbox_core.models import CollectedFile, ExecStep, JobSpec, Limits
from sandbox_core.output import HeadTailBuffer
from sandbox_core.runner import ExecOutcome, Supervisor, signal_from_init_status
from sandbox_core.sockdiag import Listener
from sandbox_core.sweep import kill_until_gone, process_uids_of
from sandbox_core.tcpwatch import TcpWatch, listeners_of_process

if TYPE_CHECKING:
    from sandbox_core.backends.docker.backend import DockerBackend

# Kill every process of the job's uid except this shell itself: the keeper runs as
# another uid, so the container survives for the next step.
_KILL_JOB_PROCESSES = "kill -9 -1 2>/dev/null; true"
# How often a running exec's state is asked for (a runtime may hold the stream open
# while a leftover holds the pipe: gVisor).
_EXEC_POLL_S = 0.25
# The farm's file helpers get the job's deadline plus this much (collecting after a
# timeout), never more than _HELPER_MAX_S: a leftover cannot hold the sandbox longer.
_HELPER_GRACE_S = 5.0
_HELPER_MAX_S = 60.0
# A feeder whose socket was shut returns at once; this is only a bound.
_FEEDER_JOIN_S = 5.0


def _feed_beside(
    sock: socket.socket, stdin: bytes | None, deadline: float
) -> threading.Thread | None:
    """Feed a step's stdin on a thread of its own while the caller pumps its output: a
    step that writes before it reads cannot deadlock against the feed. The caller joins
    the thread before it closes the socket (a send racing the close could write the
    job's bytes into whatever the worker opens next under that fd number)."""
    if not stdin:
        feed_stdin(sock, stdin, deadline)  # EOF at once
        return None
    feeder = threading.Thread(
        target=feed_stdin, args=(sock, stdin, deadline), name="stdin", daemon=True
    )
    feeder.start()
    return feeder


class DockerSession(Session):
    def __init__(
        self,
        backend: DockerBackend,
        spec: JobSpec,
        container_id: str,
        uid: int,
        launcher: Launcher | None = None,
    ) -> None:
        self.backend = backend
        self.spec = spec
        self.id = container_id
        self.launcher = launcher  # the first step's exec, started ahead (warm pool)
        self.prewarmed = False
        self.uid = uid  # the slot's: the job's processes, and the farm's helpers
        self.api: Any = backend.client.api
        self.cgroup = ContainerCgroup(container_id)
        self.cgroup.bound_tcp_buffers(spec.limits.memory_mb * d.MIB)  # before any job process
        self.files = FileTransfer(self._helper, uid)
        self.dead = False
        self.cpu_ns_at_kill = 0  # the container's CPU time as it was killed (kill())
        self.dirty = False  # a job process may be alive: sweep before touching files
        self.deadline = time.monotonic() + spec.limits.timeout_s

    # --- exec plumbing --------------------------------------------------------------

    def _exec(
        self,
        argv: list[str],
        *,
        stdin: bytes | None,
        limits: Limits,
        deadline: float,
        cancel: threading.Event | None = None,
        env: dict[str, str] | None = None,
        launcher: Launcher | None = None,
        watch: TcpWatch | None = None,
    ) -> ExecOutcome:
        out = ExecOutcome.for_limits(limits)
        started = time.monotonic()
        started_ns = time.monotonic_ns()
        exec_id, raw, early, feeder = self._launch(argv, stdin, env, launcher, deadline)
        out.spawn_ms = (time.monotonic() - started) * 1000
        # The container is killed after the stream is shut (see below), never from
        # inside the loop; leftovers of a step that exited are swept before the next.
        supervisor = Supervisor(
            out, limits, deadline, cancel, lambda: None, lambda: None, kill_drain_s=0.0, watch=watch
        )
        try:
            self._pump(raw, exec_id, out, supervisor, early)
        finally:
            # first: the engine blocks a kill for 10 s while our socket has unread output
            with contextlib.suppress(OSError):
                raw.shutdown(socket.SHUT_RDWR)  # also ends a feeder's send (EPIPE)
            if feeder is not None:
                feeder.join(_FEEDER_JOIN_S)
            if feeder is None or not feeder.is_alive():
                raw.close()  # else left open: a live feeder's fd is never reused
        if out.timed_out or out.flooded or out.cancelled or out.watch_stopped:
            self.kill()
        out.duration_ms = (time.monotonic() - started) * 1000 - out.spawn_ms
        info = None if self.dead else self._inspect(exec_id)
        code = info.get("ExitCode") if info else None
        # Only 129-255 can be either (an exit or 128 + a signal); a zero exit is never
        # heard (procevents.py: the watcher hears nonzero ones only).
        ambiguous = isinstance(code, int) and code > 128
        status = self._kernel_status(info, started_ns) if ambiguous else None
        if status is not None and isinstance(code, int) and code != _engine_code(status):
            status = None  # another process's, given the exec's pid since (an attack review)
        if status is not None:  # the kernel's word: exit(137) is not SIGKILL
            if os.WIFSIGNALED(status):
                out.signal = os.WTERMSIG(status)
            else:
                out.exit_code = os.WEXITSTATUS(status)
        elif isinstance(code, int):
            out.exit_code = code
            signal_from_init_status(out)  # the engine reports signals as 128+n
        else:
            out.signal = 9
        return out

    def _launch(
        self,
        argv: list[str],
        stdin: bytes | None,
        env: dict[str, str] | None,
        launcher: Launcher | None,
        deadline: float,
    ) -> tuple[str, socket.socket, bytes, threading.Thread | None]:
        """Start ``argv``: through the armed launcher when there is one (one write), else
        by a new exec; returns the exec's id, its stream, any output that came with the
        launcher's ack, and the thread feeding its stdin (None once fed)."""
        if launcher is not None:
            try:
                early = launcher.start(argv, env or {}, stdin)
            except LauncherGone:  # it died waiting: nothing ran, a plain exec runs it
                launcher.close()
            except OSError:  # silent: it may hold the message, so nothing runs beside it
                launcher.close()
                self.kill()
                raise
            else:
                self.prewarmed = True
                feeder = _feed_beside(launcher.sock, stdin, deadline)
                return launcher.exec_id, launcher.sock, early, feeder
        exec_id = self.api.exec_create(
            self.id,
            argv,
            stdin=stdin is not None,
            user=f"{self.uid}:{self.uid}",
            workdir=WORKSPACE,
            environment=env,
        )["Id"]
        raw = self.api.exec_start(exec_id, socket=True)._sock
        feeder = _feed_beside(raw, stdin, deadline) if stdin is not None else None
        return exec_id, raw, b"", feeder

    def _inspect(self, exec_id: str) -> dict[str, Any] | None:
        try:
            info: dict[str, Any] = self.api.exec_inspect(exec_id)
        except Exception:  # the container died under the exec (OOM-killed keeper, ...)
            self.dead = True
            return None
        return info

    def _kernel_status(self, info: dict[str, Any] | None, since_ns: int) -> int | None:
        """The exec's raw wait status as the kernel announced it (runc: its Pid is a
        host pid), or None where that is not known."""
        watcher = self.backend.exits
        if watcher is None or not info or self.backend.config.runtime != "runc":
            return None
        pid = info.get("Pid")
        return watcher.status(pid, since_ns) if isinstance(pid, int) and pid > 0 else None

    def _pump(
        self,
        raw: socket.socket,
        exec_id: str,
        out: ExecOutcome,
        supervisor: Supervisor,
        early: bytes = b"",
    ) -> None:
        """Demultiplex the engine's framed stream into the two head+tail buffers until
        the stream ends or the supervisor says stop. The exec's state is polled too, so
        leftovers holding the stream open get EXIT_DRAIN_S, as on the host backends."""
        sel = selectors.DefaultSelector()
        sel.register(raw, selectors.EVENT_READ)
        demux = FrameDemux()
        streams = {STDOUT: out.stdout, STDERR: out.stderr}
        for kind, payload in demux.feed(early):
            if kind in streams:
                supervisor.wrote(streams[kind], payload)
        next_poll = time.monotonic() + _EXEC_POLL_S
        try:
            while True:
                now = time.monotonic()
                if not supervisor.draining and now >= next_poll:
                    next_poll = now + _EXEC_POLL_S
                    with contextlib.suppress(Exception):
                        if not self.api.exec_inspect(exec_id).get("Running", True):
                            supervisor.exited()
                wait = supervisor.next_wait(poll_s=max(0.0, next_poll - now))
                if wait is None:
                    return
                if not sel.select(wait):
                    continue
                chunk = raw.recv(1 << 16)
                if not chunk:
                    return
                for kind, payload in demux.feed(chunk):
                    if kind in streams:
                        supervisor.wrote(streams[kind], payload)
        finally:
            sel.close()

    def _helper(self, argv: list[str], stdin: bytes | None = None, budget: int = d.MIB) -> bytes:
        """Run a farm-side helper command as the job user, after sweeping whatever a step
        left alive (it could stop or starve the helper); returns its stdout (bounded)."""
        self._sweep()
        limits = Limits(output_bytes=min(max(budget, 64), d.OUTPUT_BYTES[1]), head_ratio=1.0)
        now = time.monotonic()
        deadline = min(now + _HELPER_MAX_S, max(self.deadline, now) + _HELPER_GRACE_S)
        outcome = self._exec(argv, stdin=stdin, limits=limits, deadline=deadline)
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
        self.files.put({path: content})

    def write_files(self, files: dict[str, bytes]) -> None:
        if files:
            self.files.put(files)  # one tar stream, one exec

    def _listeners(self) -> tuple[list[Listener], bool]:
        """The listeners of the container's namespace, through the first of its processes
        still there (TcpWatch counts only the job uid's)."""
        for pid in (self.cgroup.pids() or [])[:8]:  # one is enough; a few may be gone
            with contextlib.suppress(OSError):
                return listeners_of_process(pid, self.id)
        return [], True

    def _sweep(self) -> None:
        """Kill what the last step left running before the farm touches the files.

        From the host, as root, by pid (the container's cgroup, the job's uid): inside the
        container a leftover of the same uid could kill the sweeper itself."""
        if self.dirty and not self.dead:
            self.dirty = False
            if not self._kill_leftovers():  # unknown cgroup layout: from inside, as the job
                self._helper(["sh", "-c", _KILL_JOB_PROCESSES])
        self.dirty = False

    def _kill_leftovers(self) -> bool:
        """Kill the job's processes from the host, by pid (one read of the container's
        cgroup when there are none); False where the host cannot see them."""
        pids = self.cgroup.pids()
        if pids is None:
            return False
        if self.uid in process_uids_of(pids).values():
            kill_until_gone(self._job_pids)
        return True

    def _job_pids(self) -> list[int]:
        found = process_uids_of(self.cgroup.pids() or [])
        return [pid for pid, uid in found.items() if uid == self.uid]

    def read_into(self, path: str, buffer: HeadTailBuffer) -> None:
        self.files.read_into(path, buffer)

    def collect(self, patterns: list[str]) -> tuple[list[CollectedFile], int]:
        if not patterns or self.dead:
            return [], 0
        return self.files.collect(patterns)

    def exec(
        self, step: ExecStep, index: int, deadline: float, cancel: threading.Event | None
    ) -> ExecOutcome:
        if self.dead:
            raise OSError("the container is gone")
        self._sweep()  # nothing a step started outlives it, as on every backend
        self.deadline = deadline
        argv = inline_argv(step, "python3")  # saves an exec per step
        if argv is None:  # past the kernel's per-argument limit: through a file
            self.files.put({f".sandfarm/step-{index}": source_of(step).encode()}, root="/tmp")
            argv = script_argv(step, "python3", f"{SCRIPTS}/step-{index}")
        if step.stdin is not None:
            argv = ["sh", "-c", 'exec "$@" < /dev/stdin', "sh", *argv]
        env = clean_environment(WORKSPACE, "/tmp", self.spec.env, from_host=())
        ooms_before = self.cgroup.oom_kills()
        cpu_before = self.cgroup.cpu_ns()
        self.dirty = True
        launcher, self.launcher = self.launcher, None  # the first step's only
        armed_here = launcher is None and exec_payload_bytes(argv, env) > EXEC_INLINE_BYTES
        prewarmed = self.prewarmed
        if armed_here:
            # dockerd keeps every exec's argv and environment for minutes after it ends
            # (its exec store is swept every 5 min, container gone or not): 128 steps of
            # 4 MiB of env held ~1 GB there, outside every bound (an attack review). So a
            # large step goes through a launcher, which reads them over its stream.
            launcher = arm(self.api, self.id, self.uid)  # None: no python3, exec carries it
        try:
            outcome = self._exec(
                argv,
                stdin=step.stdin.encode() if step.stdin is not None else None,
                limits=self.spec.limits,
                deadline=deadline,
                cancel=cancel,
                env=env,
                launcher=launcher,
                watch=TcpWatch(
                    self.uid,
                    self._listeners,
                    self.cgroup.tcp_bytes,
                    tcp_buffers_limit(self.spec.limits.memory_mb * d.MIB),
                ),
            )
        finally:
            if armed_here:  # a launcher armed for this step is no prewarm
                self.prewarmed = prewarmed
        self._sweep()  # now, not before the next step: leftovers run unwatched between
        outcome.memory_exceeded = self.cgroup.oom_kills() > ooms_before or self._oom_killed()
        # the kernel's count, read as the kill came where the cgroup went with the
        # container (an attack review: killed jobs were charged 0 ms, and a tenant whose
        # jobs all timed out spent no CPU budget)
        cpu_ns = max(self.cgroup.cpu_ns(), self.cpu_ns_at_kill)
        outcome.cpu_ms = max(0.0, (cpu_ns - cpu_before) / 1e6)
        return outcome

    def _oom_killed(self) -> bool:
        if not self.dead:
            return False
        with contextlib.suppress(Exception):
            return bool(self.api.inspect_container(self.id)["State"].get("OOMKilled"))
        return False

    def kill(self) -> None:
        """End the job now: the container and everything in it (its CPU time read first:
        its cgroup goes with it)."""
        if not self.dead:
            self.cpu_ns_at_kill = self.cgroup.cpu_ns()
        self.dead = True
        with contextlib.suppress(Exception):
            self.api.kill(self.id)

    def close(self) -> None:
        """Leftovers die before the slot is released (they would count against the next
        job's per-uid limits while the container is removed), removal behind."""
        if self.launcher is not None:  # a job that ran no step
            self.launcher.close()
            self.launcher = None
        with contextlib.suppress(Exception):
            if self.dirty and not self._kill_leftovers() and not self.dead:
                self.kill()  # no host view of its processes: kill it whole
        self.dead = True
        self.backend.remove_later(self.id)


def _engine_code(status: int) -> int:
    """The exit code the engine reports for a raw wait status: a signal N as 128+N."""
    return 128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)

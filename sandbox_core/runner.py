"""Supervising one step: streaming head+tail capture, flood-kill, a deadline, cancel and
the exit drain. ``Supervisor`` holds the rules every backend's step loop obeys;
``run_captured`` is the host-process loop built on it (the Docker session has its own
loop over the engine's stream, on the same rules)."""

from __future__ import annotations

import contextlib
import math
import os
import selectors
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from sandbox_core import defaults as d
from sandbox_core.models import Limits
from sandbox_core.output import HeadTailBuffer

_CHUNK = 1 << 16
# After a stop (timeout, flood, cancel) or the leftovers' kill: read what is left in the
# pipes for at most this long.
KILL_DRAIN_S = 1.0


class Watch(Protocol):
    """A check a step's supervision makes at each wake (at least every ``every_s``):
    a reason ends the step (tcpwatch.TcpWatch)."""

    next_check: float  # monotonic: when it next reads anything

    def __call__(self) -> str | None: ...


@dataclass
class ExecOutcome:
    """What happened to one process; classification into a status happens elsewhere."""

    stdout: HeadTailBuffer
    stderr: HeadTailBuffer
    exit_code: int | None = None  # set when the process exited
    signal: int | None = None  # set when a signal ended it
    timed_out: bool = False
    flooded: bool = False
    cancelled: bool = False
    memory_exceeded: bool = False  # the kernel says the job hit its memory limit
    farm_memory_bound: bool = False  # ...the farm's, for all jobs together (cgroups.py)
    watch_stopped: bool = False  # the step's watch stopped it (tcpwatch.py) ...
    stopped_why: str | None = None  # ... saying why
    spawn_ms: float = 0.0
    duration_ms: float = 0.0
    cpu_ms: float = 0.0
    max_rss_kb: int = 0

    @classmethod
    def for_limits(cls, limits: Limits) -> ExecOutcome:
        return cls(
            stdout=HeadTailBuffer(limits.output_bytes, limits.head_ratio),
            stderr=HeadTailBuffer(limits.output_bytes, limits.head_ratio),
        )


class Supervisor:
    """The deadline, cancel, flood and exit-drain rules of one step.

    ``stop`` ends the step now (timeout, flood, cancel, or ``watch`` saying why: the
    TCP watch); ``end_leftovers`` kills what the step's main process left running
    once it exited and the leftovers had EXIT_DRAIN_S to finish writing. After either,
    output is read for ``kill_drain_s`` more.
    """

    def __init__(
        self,
        out: ExecOutcome,
        limits: Limits,
        deadline: float,
        cancel: threading.Event | None,
        stop: Callable[[], None],
        end_leftovers: Callable[[], None],
        kill_drain_s: float = KILL_DRAIN_S,
        watch: Watch | None = None,
    ) -> None:
        self.out = out
        self.watch = watch
        self.limits = limits
        self.deadline = deadline
        self.cancel = cancel
        self._stop = stop
        self._end_leftovers = end_leftovers
        self._kill_drain_s = kill_drain_s
        self.killed = False
        self._drain_until: float | None = None

    def next_wait(self, poll_s: float | None = None) -> float | None:
        """Seconds the caller may block for output or the exit (at most ``poll_s``), or
        None: supervision is over, stop reading."""
        now = time.monotonic()
        if self._drain_until is not None:
            if not self.killed and self._watch_says_stop():  # leftovers are watched too
                return self.next_wait(poll_s)
            if now < self._drain_until:
                return _capped(min(self._drain_until - now, self._watch_wait(now)), poll_s)
            if self.killed:
                return None
            self._end_leftovers()  # exited; its leftovers had their drain
            self._killed_at(now)
            return self.next_wait(poll_s)
        if now >= self.deadline:
            self.stop("timed_out")
            return self.next_wait(poll_s)
        if self.cancel is not None and self.cancel.is_set():
            self.stop("cancelled")
            return self.next_wait(poll_s)
        if self._watch_says_stop():
            return self.next_wait(poll_s)
        wait = min(self.deadline - now, self._watch_wait(now))
        if self.cancel is not None:
            wait = min(wait, 0.05)
        return _capped(wait, poll_s)

    def _watch_says_stop(self) -> bool:
        """Ask the watch; if it gives a reason, stop the step for it."""
        if self.watch is None or not (why := self.watch()):
            return False
        self.out.stopped_why = why
        self.stop("watch_stopped")
        return True

    def _watch_wait(self, now: float) -> float:
        """Until the watch's next check: a job that writes often never delays it."""
        return math.inf if self.watch is None else max(0.0, self.watch.next_check - now)

    @property
    def draining(self) -> bool:
        """The main process exited or the step was stopped: only leftover output is read."""
        return self._drain_until is not None

    def stop(self, reason: str) -> None:
        """End the step now for ``reason`` (an ExecOutcome flag: timed_out, flooded, ...)."""
        if self.killed:
            return
        setattr(self.out, reason, True)
        self._stop()
        self._killed_at(time.monotonic())

    def exited(self) -> None:
        """The main process ended: leftovers get EXIT_DRAIN_S to finish writing."""
        if self._drain_until is None:
            self._drain_until = time.monotonic() + d.EXIT_DRAIN_S

    def wrote(self, buffer: HeadTailBuffer, chunk: bytes | memoryview) -> None:
        buffer.write(chunk)
        if self.out.stdout.total + self.out.stderr.total > self.limits.flood_kill_bytes:
            self.stop("flooded")

    def _killed_at(self, now: float) -> None:
        self.killed = True
        self._drain_until = now + self._kill_drain_s


def signal_from_init_status(out: ExecOutcome) -> None:
    """An init between us and the job (tini, bwrap, Docker's) reports a child killed by
    signal N as exit status 128+N: read it back as that signal."""
    code = out.exit_code
    if code is not None and 128 < code <= 128 + 64:
        out.exit_code, out.signal = None, code - 128


def apply_init_record(out: ExecOutcome, record: bytes) -> bool:
    """Take the job's real wait status and resource use from our init's record
    (``status=N cpu_us=N maxrss_kb=N``, see sandfarm-exec --init); False if none came."""
    fields = dict(
        item.split("=", 1) for item in record.decode(errors="replace").split() if "=" in item
    )
    try:
        status = int(fields["status"])
        cpu_us, maxrss = int(fields["cpu_us"]), int(fields["maxrss_kb"])
    except (KeyError, ValueError):
        return False
    if status < 0:
        return False
    if os.WIFSIGNALED(status):
        out.exit_code, out.signal = None, os.WTERMSIG(status)
    else:
        out.exit_code, out.signal = os.WEXITSTATUS(status), None
    out.cpu_ms, out.max_rss_kb = cpu_us / 1000, maxrss
    return True


def _capped(wait: float, cap: float | None) -> float:
    return max(0.0, wait if cap is None else min(wait, cap))


def start_process(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: str,
    preexec_fn: Callable[[], None] | None = None,
    stdin: bool = False,
    pass_fds: Sequence[int] = (),
) -> subprocess.Popen[bytes]:
    """``argv`` in a new session, its output on pipes (and its stdin, if ``stdin``)."""
    return subprocess.Popen(
        list(argv),
        stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(env),
        cwd=cwd,
        preexec_fn=preexec_fn,
        start_new_session=True,
        close_fds=True,
        pass_fds=tuple(pass_fds),
    )


def run_captured(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: str,
    limits: Limits,
    deadline: float,
    kill_tree: Callable[[], None],
    preexec_fn: Callable[[], None] | None = None,
    stdin_data: bytes | None = None,
    cancel: threading.Event | None = None,
    pass_fds: Sequence[int] = (),
    watch: Watch | None = None,
) -> ExecOutcome:
    """Start ``argv`` in a new session and supervise it until it and its output are done
    (see ``supervise``)."""
    started = time.monotonic()
    proc = start_process(
        argv,
        env=env,
        cwd=cwd,
        preexec_fn=preexec_fn,
        stdin=True,  # a pipe: the step's stdin, then EOF (as a standby's, made before it)
        pass_fds=pass_fds,
    )
    return supervise(proc, started, limits, deadline, kill_tree, stdin_data, cancel, watch)


def supervise(
    proc: subprocess.Popen[bytes],
    started: float,
    limits: Limits,
    deadline: float,
    kill_tree: Callable[[], None],
    stdin_data: bytes | None = None,
    cancel: threading.Event | None = None,
    watch: Watch | None = None,
) -> ExecOutcome:
    """Supervise ``proc`` (started at ``started``, monotonic) until it and its output are
    done. ``kill_tree`` must kill every process the job started (the caller's cgroup or
    uid sweep); it is called on timeout, flood, cancel and once the main process has
    exited and its leftovers had ``EXIT_DRAIN_S`` to finish writing.
    """
    out = ExecOutcome.for_limits(limits)
    assert proc.stdout is not None and proc.stderr is not None
    out.spawn_ms = (time.monotonic() - started) * 1000

    def kill_all() -> None:
        kill_tree()
        with contextlib.suppress(OSError):  # the session's group, should kill_tree be weak
            os.killpg(proc.pid, 9)

    supervisor = Supervisor(out, limits, deadline, cancel, kill_all, kill_all, watch=watch)
    pidfd = os.pidfd_open(proc.pid)
    sel = selectors.DefaultSelector()
    buffers = {proc.stdout.fileno(): out.stdout, proc.stderr.fileno(): out.stderr}
    for fd in buffers:
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)
    sel.register(pidfd, selectors.EVENT_READ)
    pending_stdin = memoryview(stdin_data or b"")
    stdin_fd = proc.stdin.fileno() if proc.stdin is not None else None
    if stdin_fd is not None:
        os.set_blocking(stdin_fd, False)
        sel.register(stdin_fd, selectors.EVENT_WRITE)
    status: int | None = None
    try:
        while status is None or any(fd in sel.get_map() for fd in buffers):
            wait = supervisor.next_wait()
            if wait is None:
                break
            for key, _ in sel.select(wait):
                fd = key.fd
                if fd == pidfd:
                    status = _reap(proc, out)
                    sel.unregister(pidfd)
                    supervisor.exited()
                elif fd == stdin_fd:
                    pending_stdin = _feed(proc, sel, pending_stdin)
                else:
                    chunk = _read(fd)
                    if chunk:
                        supervisor.wrote(buffers[fd], chunk)
                    elif chunk is not None:
                        sel.unregister(fd)
    finally:
        sel.close()
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        if status is None:
            kill_all()
            status = _reap(proc, out)
        os.close(pidfd)
    if os.WIFSIGNALED(status):
        out.signal = os.WTERMSIG(status)
    else:
        out.exit_code = os.WEXITSTATUS(status)
    out.duration_ms = (time.monotonic() - started) * 1000 - out.spawn_ms
    return out


def _reap(proc: subprocess.Popen[bytes], out: ExecOutcome) -> int:
    """Wait for the main process; record its CPU time and peak RSS; its wait status."""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = -1  # reaped here; keep Popen from waiting on a recycled pid
    out.cpu_ms = (usage.ru_utime + usage.ru_stime) * 1000
    out.max_rss_kb = usage.ru_maxrss
    return status


def _read(fd: int) -> bytes | None:
    """A chunk, b"" at end of stream, or None when nothing is ready yet."""
    try:
        return os.read(fd, _CHUNK)
    except BlockingIOError:
        return None
    except OSError:
        return b""


def _feed(
    proc: subprocess.Popen[bytes], sel: selectors.BaseSelector, data: memoryview
) -> memoryview:
    assert proc.stdin is not None
    fd = proc.stdin.fileno()
    try:
        written = os.write(fd, data[:_CHUNK])
        data = data[written:]
    except BlockingIOError:
        return data
    except OSError:  # the job closed its stdin
        data = data[:0]
    if not data:
        sel.unregister(fd)
        proc.stdin.close()
    return data

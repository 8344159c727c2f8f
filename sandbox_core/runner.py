"""Run one process with streaming head+tail capture, flood-kill, a deadline and cancel."""

from __future__ import annotations

import contextlib
import os
import selectors
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from sandbox_core import defaults as d
from sandbox_core.models import Limits
from sandbox_core.output import HeadTailBuffer

_CHUNK = 1 << 16


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
    duration_ms: float = 0.0
    cpu_ms: float = 0.0
    max_rss_kb: int = 0
    notes: list[str] = field(default_factory=list)


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
) -> ExecOutcome:
    """Start ``argv`` in a new session and supervise it until it and its output are done.

    ``kill_tree`` must kill every process the job started (the caller's cgroup or uid
    sweep); it is called on timeout, flood, cancel and once the main process has exited
    and its leftovers had ``EXIT_DRAIN_S`` to finish writing.
    """
    out = ExecOutcome(
        stdout=HeadTailBuffer(limits.output_bytes, limits.head_ratio),
        stderr=HeadTailBuffer(limits.output_bytes, limits.head_ratio),
    )
    started = time.monotonic()
    proc = subprocess.Popen(
        list(argv),
        stdin=subprocess.PIPE if stdin_data else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(env),
        cwd=cwd,
        preexec_fn=preexec_fn,
        start_new_session=True,
        close_fds=True,
        pass_fds=tuple(pass_fds),
    )
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
    drain_until: float | None = None
    killed = False

    def kill_all() -> None:
        kill_tree()
        with contextlib.suppress(OSError):  # the session's group, should kill_tree be weak
            os.killpg(proc.pid, 9)

    def stop(reason: str) -> None:
        nonlocal killed, drain_until
        setattr(out, reason, True)
        kill_all()
        killed = True
        drain_until = time.monotonic() + 1.0  # read what is left in the pipes, briefly

    try:
        while status is None or any(fd in sel.get_map() for fd in buffers):
            now = time.monotonic()
            limit = drain_until if drain_until is not None else deadline
            if now >= limit:
                if drain_until is None:
                    stop("timed_out")
                    continue
                if not killed:  # exited main process; kill its leftovers, then drain
                    kill_all()
                    killed = True
                    drain_until = now + 1.0
                    continue
                break
            if cancel is not None and cancel.is_set() and not killed:
                stop("cancelled")
                continue
            wait = min(limit - now, 0.05 if cancel is not None else limit - now)
            for key, _ in sel.select(wait):
                fd = key.fd
                if fd == pidfd:
                    status, usage = _reap(proc)
                    out.cpu_ms = (usage.ru_utime + usage.ru_stime) * 1000
                    out.max_rss_kb = usage.ru_maxrss
                    sel.unregister(pidfd)
                    if drain_until is None:
                        drain_until = time.monotonic() + d.EXIT_DRAIN_S
                elif fd == stdin_fd:
                    pending_stdin = _feed(proc, sel, pending_stdin)
                else:
                    chunk = _read(fd)
                    if chunk is None:
                        continue
                    if chunk:
                        buffers[fd].write(chunk)
                        flooded = out.stdout.total + out.stderr.total > limits.flood_kill_bytes
                        if flooded and not killed:
                            stop("flooded")
                    else:
                        sel.unregister(fd)
    finally:
        sel.close()
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        if status is None:
            kill_all()
            status, usage = _reap(proc)
            out.cpu_ms = (usage.ru_utime + usage.ru_stime) * 1000
            out.max_rss_kb = usage.ru_maxrss
        os.close(pidfd)
    if os.WIFSIGNALED(status):
        out.signal = os.WTERMSIG(status)
    else:
        out.exit_code = os.WEXITSTATUS(status)
    out.duration_ms = (time.monotonic() - started) * 1000
    return out


def _reap(proc: subprocess.Popen[bytes]) -> tuple[int, os.struct_rusage]:
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = -1  # reaped here; keep Popen from waiting on a recycled pid
    return status, usage


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

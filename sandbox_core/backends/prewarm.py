"""Sandboxes made before their job arrives, and torn down after its result.

A local sandbox's setup hardly depends on its job: the workspace tmpfs, the slot's
cgroups and network namespace, the mount and IPC namespaces, the uid drop and
no_new_privs (bwrap: its namespaces and our init as pid 1) need only the workspace size,
the pty bound and whether the job has network. So one background thread per worker
process does that work off the job's critical path: once a session ends it tears it down
and starts the next job's sandbox in an empty slot, where the exec helper waits on a pipe
(``sandfarm-exec --standby``). The job's first step then sends only what is its own
(argv, environment, rlimits); the helper loads the syscall filter and execs it.

What a standby could share with a job, and why it does not (SECURITY.md, "a sandbox
made before its job"): it is started only in a slot whose cgroup is empty (its last
session closed: cgroup killed, workspace unmounted), always of the default limits'
shape, and a slot holding one runs nothing else (a session of any backend opening there
first takes it or closes it); it is used only by a job of its shape; the job's rlimits
are set by its own uid, so a job whose limits are not all below the worker's runs cold;
nothing of a job reaches a standby before that job is there.
"""

from __future__ import annotations

import logging
import os
import resource
import subprocess
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sandbox_core.errors import SlotBusyError
from sandbox_core.models import JobSpec

if TYPE_CHECKING:
    from sandbox_core.backends.local import LocalBackend
    from sandbox_core.backends.local_session import LocalSession

log = logging.getLogger(__name__)

# Longest a session waits for the thread to finish the teardown of its slot.
SETTLE_TIMEOUT_S = 60.0
# Standbys one process keeps at most (the oldest goes): each holds a slot, a workspace and
# a process, and a backend that is never closed would otherwise keep its own for ever.
MAX_READY = 2


@dataclass
class Standby:
    """A sandbox's helper waiting for its job on ``go_fd``; ``status_fd``: our init's."""

    proc: subprocess.Popen[bytes]
    go_fd: int
    status_fd: int | None = None

    def alive(self) -> bool:
        """Still waiting (checked without reaping it: the step's supervisor does)."""
        try:
            return os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None
        except ChildProcessError:
            return False

    def go(self, argv: Sequence[str], env: dict[str, str], direct: int, rlimits: Rlimits) -> bool:
        """Send the job (see sandfarm-exec --standby); False if the helper is gone, in
        which case nothing of the job ran."""
        try:
            fields = [f"D{direct}", *(f"R{r}:{s}:{h}" for r, s, h in rlimits)]
            fields += [f"E{k}={v}" for k, v in env.items()] + [f"A{a}" for a in argv] + ["."]
            if any("\0" in f for f in fields):  # validation refuses NUL: fields never split
                raise ValueError("a NUL byte in a job's argv or environment")
            data = memoryview(b"".join(f.encode() + b"\0" for f in fields))
            while data:
                data = data[os.write(self.go_fd, data) :]
        except BrokenPipeError:
            return False
        finally:
            os.close(self.go_fd)
            self.go_fd = -1
        return True

    def discard(self) -> None:
        """Let the helper go without a job (it exits on EOF) and reap it."""
        if self.go_fd >= 0:
            os.close(self.go_fd)
            self.go_fd = -1
        if self.status_fd is not None:
            os.close(self.status_fd)
            self.status_fd = None
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


Rlimits = Sequence[tuple[int, int, int]]


def lowers_only(rlimits: Rlimits) -> bool:
    """Whether the job's uid may set these itself: no hard limit above the worker's."""
    for res, _soft, hard in rlimits:
        current = resource.getrlimit(res)[1]
        if current != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or hard > current):
            return False
    return True


def shape(spec: JobSpec) -> tuple[int, int, bool]:
    """What a standby is made for: the workspace size, the pty bound, network or not."""
    return (spec.limits.workspace_mb, spec.limits.ptys, spec.limits.network)


# Every standby is of the default limits' shape: never of the last job's, which another
# tenant chose (it would tell the next job about it, and let it make the next one wait).
TEMPLATE = JobSpec.model_validate({"command": "true"})


# --- the process's one background thread and what it holds ------------------------
_cond = threading.Condition()
_tasks: deque[Callable[[], None]] = deque()
_busy = False
_ready: dict[object, LocalSession] = {}  # key -> a session whose standby waits
_preparing: set[object] = set()  # keys with a standby queued or being made
_thread: threading.Thread | None = None


def _reset_after_fork() -> None:
    """A forked child has no thread and owns none of its parent's sandboxes."""
    global _cond, _busy, _thread
    _cond = threading.Condition()
    _tasks.clear()
    _ready.clear()
    _preparing.clear()
    _busy, _thread = False, None


os.register_at_fork(after_in_child=_reset_after_fork)


def _key(backend: LocalBackend, index: int | None = None) -> object:
    # In a worker's pool process a standby is keyed by its slot (one per slot, whatever
    # its backend; the first one unless ``index`` says); elsewhere by its backend, which
    # takes any free slot.
    if backend.slots.lanes:
        return ("slot", backend.slots.index if index is None else index)
    return ("backend", id(backend))


def _lane_keys(backend: LocalBackend) -> list[object]:
    return [("slot", index) for index in backend.slots.lanes]


def take(backend: LocalBackend, spec: JobSpec) -> LocalSession | None:
    """A ready session for ``spec`` (its standby waiting), or None: open one cold. Either
    way, once this returns a cold session finds a free slot, or one about to be free."""
    if backend.slots.lanes:
        return _take_lane(backend, spec)
    key = _key(backend)
    with _cond:
        settled = _cond.wait_for(lambda: key not in _preparing, SETTLE_TIMEOUT_S)
        if not settled:  # the last session's teardown hangs: its slot is not free
            raise SlotBusyError(backend.slots.index, SETTLE_TIMEOUT_S)
        session = _ready.pop(key, None)
    if session is None:
        return None
    try:
        if fits(session, backend, spec):
            session.adopt(spec)
            _submit(key, lambda: _prepare(backend, key))  # the next, while this job runs
            return session
    except BaseException:
        _close(session)
        raise
    _close(session)
    return None


def _take_lane(backend: LocalBackend, spec: JobSpec) -> LocalSession | None:
    """take() in a pool process's fixed slots: a standby of this backend and shape in one
    of them, without waiting for the teardown of the others; else, once the thread has
    nothing left to do, None (standbys that do not fit are closed first when no slot is
    free for a cold session)."""
    keys = _lane_keys(backend)

    def ready() -> LocalSession | None:
        for key in keys:
            session = _ready.get(key)
            if session and session.backend is backend and shape(session.spec) == shape(spec):
                return session
        return None

    with _cond:
        settled = _cond.wait_for(
            lambda: ready() is not None or (not _tasks and not _busy), SETTLE_TIMEOUT_S
        )
        if not settled:  # a teardown hangs: its slot is not free
            raise SlotBusyError(backend.slots.index, SETTLE_TIMEOUT_S)
        session = ready()
        if session is not None:
            del _ready[_key(backend, session.slot.index)]
            misfits = []
        else:  # a cold session needs a free slot: standbys of other jobs' shapes go
            held = [key for key in keys if key in _ready]
            misfits = [_ready.pop(key) for key in held] if len(held) == len(keys) else []
    for other in misfits:
        _close(other)
    if session is None:
        return None
    try:
        if session.waiting():
            session.adopt(spec)
            _submit(None, lambda: _prepare(backend, None))  # the other slot, while this runs
            return session
    except BaseException:
        _close(session)
        raise
    _close(session)
    return None


def fits(session: LocalSession, backend: LocalBackend, spec: JobSpec) -> bool:
    """Whether ``session``'s standby may run ``spec``: same backend and shape, waiting."""
    return session.backend is backend and shape(session.spec) == shape(spec) and session.waiting()


def vacate(index: int | None) -> None:
    """Close the standby waiting in fixed slot ``index`` (a backend that makes none, such
    as docker, is about to run a job there)."""
    if index is None:
        return
    with _cond:
        _cond.wait_for(lambda: not _tasks and not _busy, SETTLE_TIMEOUT_S)
        session = _ready.pop(("slot", index), None)
    if session is not None:
        _close(session)


def retire(backend: LocalBackend, session: LocalSession, now: bool = False) -> None:
    """Tear ``session`` down in the background, then make the next standby there.
    ``now``: tear it down here first (a teardown that takes long is its own job's time:
    in the background it would delay the next job, maybe another tenant's)."""
    if now:
        _close(session)
    if backend.slots.lanes:

        def in_lane() -> None:
            if not now:
                _close(session)
            _prepare(backend, None)

        _submit(None, in_lane)
        return
    key = _key(backend)
    with _cond:
        again = key not in _ready and key not in _preparing

    def task() -> None:
        if not now:
            _close(session)
        if again:
            _prepare(backend, key)

    _submit(key if again else None, task)


def discard(backend: LocalBackend) -> None:
    """Close this backend's standbys and wait for its teardowns (the backend closes)."""
    keys = _lane_keys(backend) if backend.slots.lanes else [_key(backend)]
    with _cond:
        _cond.wait_for(lambda: not _tasks and not _busy, SETTLE_TIMEOUT_S)
        mine = [key for key in keys if key in _ready and _ready[key].backend is backend]
        sessions = [_ready.pop(key) for key in mine]
    for session in sessions:
        _close(session)


def _submit(key: object | None, task: Callable[[], None]) -> None:
    global _thread
    with _cond:
        if key is not None:
            _preparing.add(key)
        _tasks.append(task)
        if _thread is None or not _thread.is_alive():
            # One long-lived thread: a standby's parent-death signal follows the thread
            # that started it.
            _thread = threading.Thread(target=_loop, name="sandfarm-prewarm", daemon=True)
            _thread.start()
        _cond.notify_all()


def _loop() -> None:
    global _busy
    while True:
        with _cond:
            _cond.wait_for(lambda: bool(_tasks))
            task = _tasks.popleft()
            _busy = True
        try:
            task()
        except Exception:
            log.exception("prewarm task failed")
        finally:
            with _cond:
                _busy = False
                _cond.notify_all()


def settle() -> None:
    """Wait until the thread has nothing left to do."""
    with _cond:
        _cond.wait_for(lambda: not _tasks and not _busy, SETTLE_TIMEOUT_S)


def _prepare(backend: LocalBackend, key: object | None) -> None:
    """A standby in a free slot (none when no slot is free); ``key``: the backend's own,
    for a backend without fixed slots (its entry in _preparing ends here)."""
    session, evicted = None, []
    try:
        session = backend.standby_session(TEMPLATE)
    finally:
        with _cond:
            if key is not None:
                _preparing.discard(key)
            if session is not None:
                _ready[key if key is not None else _key(backend, session.slot.index)] = session
                while len(_ready) > MAX_READY:
                    evicted.append(_ready.pop(next(iter(_ready))))
            _cond.notify_all()
    for old in evicted:
        _close(old)


def _close(session: LocalSession) -> None:
    try:
        session.close()
    finally:
        session.backend.slots.give(session.slot)

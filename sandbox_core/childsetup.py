"""What a local sandbox step's child does between fork and exec: namespaces, mounts,
rlimits, the privilege drop, the syscall filter.

``ChildSetup`` is one description of that setup, run either by the compiled exec
helper (``sandbox_core/native/sandfarm-exec.c``, from ``helper_argv``) or, where it is
not built, in Python as a ``preexec_fn``. The Python side must not take locks or start
threads; it only makes system calls.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import functools
import os
import re
import resource
import shutil
import signal
import socket
import struct
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from sandbox_core import landlock, seccomp
from sandbox_core.defaults import EXEC_HELPER_AUTO, MIB
from sandbox_core.loopback import configure_loopback
from sandbox_core.models import Limits

_libc = ctypes.CDLL(None, use_errno=True)
T = TypeVar("T")
CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REMOUNT = 1, 2, 4, 8, 32
_MS_BIND, _MS_REC, _MS_PRIVATE = 4096, 0x4000, 0x40000
_MNT_DETACH = 2
# Host directories every uid may write, and /run (unix sockets of local services): a
# job gets its own tmpfs over each, so nothing it leaves there outlives it or reaches
# another slot, and no host socket is in reach.
SHARED_WRITABLE_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run")
# The host's cgroup tree: every slot's counters (CPU time, memory) are readable there.
CGROUP_ROOT = "/sys/fs/cgroup"
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_PDEATHSIG = 1
_SIOCGIFFLAGS, _SIOCSIFFLAGS = 0x8913, 0x8914
_IFF_UP = 0x1


def unshare(flags: int) -> None:
    if _libc.unshare(flags) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"unshare: {os.strerror(err)}")


def loopback_up() -> None:
    """Bring up ``lo`` in a fresh network namespace (it starts down)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        ifreq = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(sock, _SIOCGIFFLAGS, ifreq))[1]
        fcntl.ioctl(sock, _SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | _IFF_UP))


@functools.cache
def private_dirs() -> tuple[str, ...]:
    """SHARED_WRITABLE_DIRS as private_tmp mounts them: each real path that is a
    directory on this host."""
    found = (os.path.realpath(path) for path in SHARED_WRITABLE_DIRS)
    return tuple(dict.fromkeys(path for path in found if os.path.isdir(path)))


def private_tmp(size_mb: int) -> None:
    """Private mount and IPC namespaces: tmpfs over SHARED_WRITABLE_DIRS, a fresh mqueue,
    a /proc showing only the job's processes, no cgroup tree. Keep in step with private_tmp() in
    native/sandfarm-exec.c."""
    unshare(CLONE_NEWNS | CLONE_NEWIPC)
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE)
    # inodes bounded, a quarter of the workspace's bound each: the kernel evicts them in
    # the exit of the job's last process, which must end within the slot's kill
    opts = f"size={size_mb}m,nr_inodes={max(1024, size_mb * 64)},mode=1777"
    for path in SHARED_WRITABLE_DIRS:
        real = os.path.realpath(path)
        if os.path.isdir(real):
            _mount("tmpfs", real, "tmpfs", _MS_NOSUID | _MS_NODEV, opts)
    os.makedirs("/run/lock", exist_ok=True)
    os.chmod("/run/lock", 0o1777)
    if os.path.isdir("/dev/mqueue"):
        _mount("mqueue", "/dev/mqueue", "mqueue", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    _mount("proc", "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, "hidepid=invisible")
    if os.path.isdir("/sys"):  # of the job's network namespace (joined before this)
        flags = _MS_NOSUID | _MS_NODEV | _MS_NOEXEC
        try:
            _mount("sysfs", "/sys", "sysfs", flags | _MS_RDONLY)
        except OSError as exc:
            # The host's namespace (a network job): the kernel makes no second sysfs of
            # it (EBUSY), so the host's is bound, without its submounts, read-only. It
            # was not: network jobs on L1 failed to start.
            if exc.errno != errno.EBUSY:
                raise
            _mount("/sys", "/sys", None, _MS_BIND)
            _mount(None, "/sys", None, flags | _MS_REMOUNT | _MS_BIND | _MS_RDONLY)
    if os.path.isdir(CGROUP_ROOT):  # every slot's counters out of view, as in bwrap, docker
        flags = _MS_NOSUID | _MS_NODEV | _MS_NOEXEC | _MS_RDONLY
        _mount("tmpfs", CGROUP_ROOT, "tmpfs", flags, "size=4k,mode=0555")


def mount_devpts(target: str, max_ptys: int) -> None:
    """A new devpts instance on ``target`` holding at most ``max_ptys`` ptys: the host's
    pty table is one for everyone, and no rlimit or cgroup bounds a job's share of it."""
    opts = f"newinstance,ptmxmode=0666,mode=0620,max={max_ptys}"
    _mount("devpts", target, "devpts", _MS_NOSUID | _MS_NOEXEC, opts)


def private_devpts(max_ptys: int) -> None:
    """The job's own devpts over /dev/pts and /dev/ptmx. Keep in step with
    private_devpts() in native/sandfarm-exec.c."""
    mount_devpts("/dev/pts", max_ptys)
    _mount("/dev/pts/ptmx", "/dev/ptmx", None, _MS_BIND)


def hide_mounts(under: str, keep: str) -> None:
    """Unmount, in this (private) mount namespace, every mount below ``under`` except
    ``keep`` and its submounts: other jobs' workspaces would show in mountinfo."""

    def inside(path: str, directory: str) -> bool:
        return path == directory or path.startswith(directory.rstrip("/") + "/")

    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as fh:
        points = [_unescape(line.split(" ")[4]) for line in fh if line.count(" ") >= 4]
    for point in reversed(points):
        if not inside(point, under) or point == under or inside(point, keep):
            continue
        if _libc.umount2(point.encode("utf-8", "surrogateescape"), _MNT_DETACH) != 0:
            err = ctypes.get_errno()
            if err not in (errno.EINVAL, errno.ENOENT):
                raise OSError(err, f"umount {point}: {os.strerror(err)}")


def _unescape(field: str) -> str:
    """mountinfo's octal escapes (\\040 for a space) decoded."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _mount(
    source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None
) -> None:
    def raw(text: str | None) -> bytes | None:
        return text.encode() if text is not None else None

    if _libc.mount(raw(source), raw(target), raw(fstype), flags, raw(data)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {fstype or source} on {target}: {os.strerror(err)}")


def env_memfd(env: dict[str, str]) -> int:
    """The environment as a NUL-separated KEY=VALUE block in a memfd (for --env-fd):
    never on a command line, which other uids can read in /proc."""
    return bytes_memfd(
        "sandfarm-env", b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items())
    )


def bytes_memfd(name: str, data: bytes) -> int:
    fd = os.memfd_create(name, 0)  # not CLOEXEC: handed to the helper, which closes it
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def join_network_namespace(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


def new_network_namespace() -> int:
    """A new network namespace with only loopback up (``loopback.configure_loopback``),
    kept alive by the returned fd (root only). One per session: a namespace outlives its
    processes' sockets (TIME_WAIT for ~60 s, loopback's and TCP's counters, /proc/net's
    tables), so a job's next one in a slot must not share it (SECURITY.md, "the slot's
    loopback"). Made in a thread of its own (``in_own_thread``: a forked helper cost a
    fork of the pool process and could outlive a killed parent).
    """

    def make() -> int:
        unshare(CLONE_NEWNET)
        configure_loopback()  # up, with small packets (why: loopback.py)
        return os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)

    return in_own_thread(make)


def in_own_thread(work: Callable[[], T]) -> T:
    """``work()`` in a thread of its own that ends at once, its exception raised here:
    unshare or setns of CLONE_NEWNET moves only the calling thread, so no other thread of
    ours and no process is ever in the namespace it makes or joins."""
    done: list[T] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            done.append(work())
        except BaseException as exc:  # raised in the caller's thread below
            failed.append(exc)

    thread = threading.Thread(target=run, name="sandfarm-netns", daemon=True)
    thread.start()
    thread.join()
    if failed:
        raise failed[0]
    return done[0]


def private_network(as_root: bool) -> None:
    """A network namespace with only loopback; unprivileged callers go via a user ns."""
    if as_root:
        unshare(CLONE_NEWNET)
    else:
        uid, gid = os.geteuid(), os.getegid()
        unshare(CLONE_NEWUSER | CLONE_NEWNET)
        with open("/proc/self/setgroups", "w") as fh:
            fh.write("deny")
        with open("/proc/self/uid_map", "w") as fh:
            fh.write(f"{uid} {uid} 1")
        with open("/proc/self/gid_map", "w") as fh:
            fh.write(f"{gid} {gid} 1")
    loopback_up()


def default_signals() -> None:
    """Every signal to its default, none blocked (as sandfarm-exec's default_signals):
    exec keeps what the worker ignores or blocks (Celery's pool ignores SIGINT)."""
    for sig in signal.valid_signals():
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            with contextlib.suppress(OSError, ValueError):
                signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, set())


def no_new_privileges() -> None:
    """setuid binaries (su, ping, ...) cannot raise privileges after this."""
    _libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)


def die_with_parent() -> None:
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def rlimits_for(limits: Limits, address_space: bool = True) -> list[tuple[int, int, int]]:
    """(resource, soft, hard) for a job; the hard CPU limit is one second above the soft.
    ``address_space``: also cap RLIMIT_AS at the memory limit (where no cgroup does)."""
    memory = [(resource.RLIMIT_AS, limits.memory_mb * MIB, limits.memory_mb * MIB)]
    return [
        *(memory if address_space else []),
        (resource.RLIMIT_CPU, limits.cpu_s, limits.cpu_s + 1),
        (resource.RLIMIT_FSIZE, limits.file_size_mb * MIB, limits.file_size_mb * MIB),
        (resource.RLIMIT_NPROC, limits.processes, limits.processes),
        (resource.RLIMIT_NOFILE, limits.open_files, limits.open_files),
        (resource.RLIMIT_CORE, 0, 0),
    ]


def find_exec_helper(configured: str) -> str | None:
    """The sandfarm-exec to use: ``configured`` as a path, '' for none (Python child
    setup), or 'auto': beside the running interpreter (make setup builds it into the
    venv), else on PATH."""
    if configured != EXEC_HELPER_AUTO:
        return configured or None
    beside = os.path.join(os.path.dirname(sys.executable), "sandfarm-exec")
    if os.access(beside, os.X_OK):
        return beside
    return shutil.which("sandfarm-exec")


def statically_linked(path: str) -> bool:
    """Whether the ELF file at ``path`` has no program interpreter (PT_INTERP): nothing of
    the environment (LD_PRELOAD) loads into it. False for anything unreadable. Judged
    again when the file changes (a helper rebuilt under a running worker)."""
    try:
        info = os.stat(path)
    except OSError:
        return False
    return _statically_linked(path, info.st_ino, info.st_mtime_ns, info.st_size)


@functools.cache
def _statically_linked(path: str, *_identity: int) -> bool:
    try:
        with open(path, "rb") as fh:
            header = fh.read(64)
            if header[:5] != b"\x7fELF\x02" or header[5] != 1:  # 64-bit little-endian
                return False
            (phoff,) = struct.unpack_from("<Q", header, 32)
            phentsize, phnum = struct.unpack_from("<HH", header, 54)
            fh.seek(phoff)
            table = fh.read(phentsize * phnum)
    except OSError:
        return False
    types = (struct.unpack_from("<I", table, i * phentsize)[0] for i in range(phnum))
    return len(table) == phentsize * phnum and 3 not in types  # 3: PT_INTERP


@dataclass(frozen=True)
class ChildSetup:
    """What the child does before exec, in this order (the order matters)."""

    cgroup_procs: Sequence[str] = ()  # join the job's cgroups while still root
    private_net: bool = False  # needs privilege: before the uid drop
    net_as_root: bool = True
    netns_fd: int | None = None  # join this namespace instead of making one
    private_tmp_mb: int | None = None  # own /tmp, /var/tmp, /dev/shm, /run, /proc view
    devpts_max: int | None = None  # own pty instance (needs private_tmp_mb)
    hide_under: str | None = None  # unmount other mounts there (needs private_tmp_mb) ...
    keep: str | None = None  # ... but this one (the job's own workspace)
    landlock_scope: int = 0  # Landlock scopes, after no_new_privs (landlock.py) ...
    sock_dirs: Sequence[str] = ()  # ... and where socket files may be made, if bounded
    seccomp: bytes | None = None  # loaded last, just before exec
    rlimits: Sequence[tuple[int, int, int]] = ()
    uid: int | None = None
    gid: int | None = None
    umask: int = 0o022

    def helper_argv(
        self,
        helper: str,
        env_fd: int | None,
        seccomp_fd: int | None = None,
        direct: int = 0,
        standby_fd: int | None = None,
        job_later: bool = False,
    ) -> list[str] | None:
        """The same setup as sandfarm-exec arguments, or None where only Python can do
        it (an unprivileged user + network namespace). The helper starts with an empty
        environment and gets the job's from ``env_fd`` for the final exec only; with
        ``standby_fd`` it waits there for the job (argv, env, direct, rlimits) instead.
        ``job_later``: a standby whose init waits for the job (no rlimits here either)."""
        job_later = job_later or standby_fd is not None
        if self.private_net and self.netns_fd is None:
            return None
        argv = [helper]
        if standby_fd is not None:
            argv += ["--standby", str(standby_fd)]
        elif env_fd is not None:
            argv += ["--env-fd", str(env_fd)]
        if self.seccomp is not None:
            if seccomp_fd is None:
                return None
            argv += ["--seccomp-fd", str(seccomp_fd)]
        for path in self.cgroup_procs:  # first, as __call__: private_tmp hides the tree
            argv += ["--cgroup", path]
        if self.netns_fd is not None:  # before private_tmp: its sysfs shows this one
            argv += ["--netns-fd", str(self.netns_fd)]
        if self.private_tmp_mb is not None:
            argv += ["--private-tmp", str(self.private_tmp_mb)]
            if self.devpts_max is not None:
                argv += ["--devpts", str(self.devpts_max)]
            if self.hide_under is not None and self.keep is not None:
                argv += ["--hide-under", self.hide_under, "--keep", self.keep]
        for res, soft, hard in () if job_later else self.rlimits:
            argv += ["--rlimit", f"{res}:{soft}:{hard}"]
        if self.uid is not None:
            gid = self.gid if self.gid is not None else self.uid
            argv += ["--uid", str(self.uid), "--gid", str(gid)]
        if self.landlock_scope:
            argv += ["--landlock-scope", str(self.landlock_scope)]
        for path in self.sock_dirs:
            argv += ["--landlock-sock-dir", path]
        if direct and not job_later:
            argv += ["--direct", str(direct)]
        return [*argv, "--umask", f"{self.umask:o}", "--"]

    def __call__(self) -> None:
        pid = str(os.getpid())
        for path in self.cgroup_procs:
            with open(path, "w") as fh:
                fh.write(pid)
        if self.netns_fd is not None:
            join_network_namespace(self.netns_fd)
        elif self.private_net:
            private_network(self.net_as_root)
        if self.private_tmp_mb is not None:
            private_tmp(self.private_tmp_mb)
            if self.devpts_max is not None:
                private_devpts(self.devpts_max)
            if self.hide_under is not None and self.keep is not None:
                hide_mounts(self.hide_under, self.keep)
        for res, soft, hard in self.rlimits:
            resource.setrlimit(res, (soft, hard))
        if self.uid is not None:
            gid = self.gid if self.gid is not None else self.uid
            os.setgroups([])
            os.setresgid(gid, gid, gid)
            os.setresuid(self.uid, self.uid, self.uid)
        die_with_parent()  # after the uid change, which would clear it
        no_new_privileges()
        if self.landlock_scope or self.sock_dirs:
            landlock.restrict(self.landlock_scope, self.sock_dirs)
        os.umask(self.umask)
        default_signals()
        if self.seccomp is not None:
            seccomp.load(self.seccomp)

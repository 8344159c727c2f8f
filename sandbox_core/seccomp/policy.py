"""THE job syscall policy: one definition, compiled to classic BPF (bpf.py, for L1 and L2)
and to a Docker seccomp profile (docker_profile.py, for L3), so the three never drift.

An allowlist: moby's default profile (what ordinary programs use, for a container with
no capability added), then our changes below, each with its reason. Anything the table
knows and no rule allows is refused with EPERM; a number above the table (a newer
kernel's call) gets ENOSYS, so glibc's fallbacks work; other ABIs are refused.

Argument checks look at the low 32 bits of an argument, which is all the kernel reads
of every argument checked here (see bpf.py); the Docker profile compares all 64, but
where a refusal must not be passed by a stray high word (RefuseWhenAll).
"""

from __future__ import annotations

import errno
from collections.abc import Iterable
from dataclasses import dataclass

from sandbox_core.errors import SandfarmError
from sandbox_core.seccomp.arches import ARCHES, Arch

EPERM, ENOSYS, EAFNOSUPPORT = errno.EPERM, errno.ENOSYS, errno.EAFNOSUPPORT
EOPNOTSUPP = errno.EOPNOTSUPP
ALL_ARCHES = tuple(ARCHES)
DEFAULT_ERRNO = EPERM  # a call the table knows and no rule allows
NEWER_ERRNO = ENOSYS  # a number above the table: a newer kernel's call, glibc falls back
FOREIGN_ERRNO = ENOSYS  # another ABI: i386 via int 0x80, x32, or not the native arch


class SyscallPolicyError(SandfarmError, ValueError):
    """The policy names a call no table knows, or decides one call twice."""


@dataclass(frozen=True)
class Allow:
    """Allowed whatever the arguments."""


@dataclass(frozen=True)
class Refuse:
    errno: int


@dataclass(frozen=True)
class FlagsClear:
    """Allowed iff none of ``mask``'s bits is set in args[index]; else errno ``refuse``."""

    index: int
    mask: int
    refuse: int


@dataclass(frozen=True)
class OneOf:
    """Allowed iff args[index] is one of ``values``; else errno ``refuse``. ``requires``:
    (value, other index, other value): that value is allowed only with args[other] equal
    to other value. The Docker profile lists refused values below ``known_below`` one by
    one (it cannot say "any other value" unless the answer is the default EPERM)."""

    index: int
    values: tuple[int, ...]
    refuse: int
    requires: tuple[tuple[int, int, int], ...] = ()
    known_below: int = 0


@dataclass(frozen=True)
class RefuseWhenAll:
    """Allowed unless args[index] equals value for every (index, value) of ``equal``;
    then errno ``refuse`` (the default errno only: the Docker profile says it by allowing
    every other case, as it cannot let a conditional refusal beat an allowance)."""

    equal: tuple[tuple[int, int], ...]
    refuse: int = DEFAULT_ERRNO


Decision = Allow | Refuse | FlagsClear | OneOf | RefuseWhenAll
ALLOW = Allow()


@dataclass(frozen=True)
class Rule:
    names: tuple[str, ...]
    decision: Decision
    why: str
    arches: tuple[str, ...] = ALL_ARCHES


def _names(text: str) -> tuple[str, ...]:
    return tuple(text.split())


# moby's default profile (github.com/moby/profiles seccomp/default.json at 3c28324,
# 2026-05-06, vendored by moby/moby): the calls it allows every container unconditionally,
# without a capability, that both x86_64 and aarch64 have. Left out: socketpair,
# personality, setsockopt, the io_* calls, memfd_secret, fadvise64, preadv2 and pwritev2
# (rules below), and the 32-bit-only names (_llseek, ...).
MOBY_COMMON = _names("""
    accept accept4 adjtimex bind brk cachestat capget capset chdir clock_adjtime
    clock_getres clock_gettime clock_nanosleep close close_range connect copy_file_range dup
    dup3 epoll_create1 epoll_ctl epoll_pwait epoll_pwait2 eventfd2 execve execveat exit
    exit_group faccessat faccessat2 fallocate fanotify_mark fchdir fchmod fchmodat fchmodat2
    fchown fchownat fcntl fdatasync fgetxattr flistxattr flock fremovexattr fsetxattr fstat
    fstatfs fsync ftruncate futex futex_requeue futex_wait futex_waitv futex_wake
    get_robust_list getcpu getcwd getdents64 getegid geteuid getgid getgroups getitimer
    getpeername getpgid getpid getppid getpriority getrandom getresgid getresuid getrlimit
    getrusage getsid getsockname getsockopt gettid gettimeofday getuid getxattr getxattrat
    inotify_add_watch inotify_init1 inotify_rm_watch ioctl ioprio_get ioprio_set kill
    landlock_add_rule landlock_create_ruleset landlock_restrict_self lgetxattr linkat listen
    listmount listxattr listxattrat llistxattr lremovexattr lseek lsetxattr madvise
    map_shadow_stack membarrier memfd_create mincore mkdirat mknodat mlock mlock2 mlockall
    mmap mprotect mq_getsetattr mq_notify mq_open mq_timedreceive mq_timedsend mq_unlink
    mremap mseal msgctl msgget msgrcv msgsnd msync munlock munlockall munmap
    name_to_handle_at nanosleep newfstatat openat openat2 pidfd_open pidfd_send_signal pipe2
    pkey_alloc pkey_free pkey_mprotect ppoll prctl pread64 preadv prlimit64 process_mrelease
    pselect6 pwrite64 pwritev read readahead readlinkat readv recvfrom recvmmsg recvmsg
    remap_file_pages removexattr removexattrat renameat renameat2 restart_syscall rseq
    rt_sigaction rt_sigpending rt_sigprocmask rt_sigqueueinfo rt_sigreturn rt_sigsuspend
    rt_sigtimedwait rt_tgsigqueueinfo sched_get_priority_max sched_get_priority_min
    sched_getaffinity sched_getattr sched_getparam sched_getscheduler sched_rr_get_interval
    sched_setaffinity sched_setattr sched_setparam sched_setscheduler sched_yield seccomp
    semctl semget semop semtimedop sendfile sendmmsg sendmsg sendto set_robust_list
    set_tid_address setfsgid setfsuid setgid setgroups setitimer setpgid setpriority
    setregid setresgid setresuid setreuid setrlimit setsid setuid setxattr setxattrat shmat
    shmctl shmdt shmget shutdown sigaltstack signalfd4 splice statfs statmount statx
    symlinkat sync sync_file_range syncfs sysinfo tee tgkill timer_create timer_delete
    timer_getoverrun timer_gettime timer_settime timerfd_create timerfd_gettime
    timerfd_settime times tkill truncate umask uname unlinkat utimensat vmsplice wait4
    waitid write writev
""")
# The same list's calls that only x86_64 has (the pre-*at legacy calls aarch64 never had),
# with arch_prctl and modify_ldt, which moby allows on amd64.
MOBY_X86_64 = _names("""
    access alarm arch_prctl chmod chown creat dup2 epoll_create epoll_ctl_old epoll_wait
    epoll_wait_old eventfd fork futimesat get_thread_area getdents getpgrp inotify_init lchown
    link lstat mkdir mknod modify_ldt open pause pipe poll readlink rename rmdir select
    set_thread_area signalfd stat symlink time unlink uretprobe utime utimes vfork
""")

CLONE_NEWTIME, CLONE_NEWNS, CLONE_NEWCGROUP = 0x80, 0x00020000, 0x02000000
CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWUSER = 0x04000000, 0x08000000, 0x10000000
CLONE_NEWPID, CLONE_NEWNET = 0x20000000, 0x40000000
# moby's mask (0x7E020000): every namespace flag but CLONE_NEWTIME, whose bit is part of
# clone()'s exit signal (CSIGNAL) and is dropped from its flags by the kernel.
CLONE_NAMESPACES = CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC
CLONE_NAMESPACES |= CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET
UNSHARE_NAMESPACES = CLONE_NAMESPACES | CLONE_NEWTIME
AF_UNIX, AF_INET, AF_INET6 = 1, 2, 10
AF_MAX = 46  # linux/socket.h (6.18): families at or above it do not exist
SOL_SOCKET, SO_RCVLOWAT = 1, 18  # asm-generic/socket.h: the same on x86_64 and aarch64
POSIX_FADV_DONTNEED = 4  # linux/fadvise.h (x86_64, aarch64)
RWF_NOWAIT = 0x8  # linux/fs.h
# personality(2): PER_LINUX, PER_LINUX32, UNAME26, PER_LINUX32|UNAME26, and the query.
PERSONALITIES = (0x0, 0x8, 0x20000, 0x20008, 0xFFFFFFFF)

RULES: tuple[Rule, ...] = (
    Rule(MOBY_COMMON, ALLOW, "moby's default profile: what ordinary programs use"),
    Rule(MOBY_X86_64, ALLOW, "moby's default profile, x86_64's own calls", ("x86_64",)),
    Rule(
        ("ptrace", "process_vm_readv", "process_vm_writev"),
        ALLOW,
        "as moby on kernels >= 4.8, where a tracer can no longer change a call past seccomp"
        " (older kernels are not supported)",
    ),
    Rule(
        ("uprobe",),
        ALLOW,
        "not in moby yet; as its uretprobe: only the kernel's uprobe trampoline calls it",
        ("x86_64",),
    ),
    Rule(
        ("clone",),
        FlagsClear(0, CLONE_NAMESPACES, EPERM),
        "threads and fork, but no new namespace: a user namespace hands out capabilities",
    ),
    Rule(
        ("unshare",),
        FlagsClear(0, UNSHARE_NAMESPACES, EPERM),
        "unshare of files or fs state only, no new namespace (as clone)",
    ),
    Rule(
        ("clone3",),
        Refuse(ENOSYS),
        "its flags are behind a pointer seccomp cannot read; glibc falls back to clone",
    ),
    Rule(
        ("socket",),
        OneOf(0, (AF_UNIX, AF_INET, AF_INET6), EAFNOSUPPORT, known_below=AF_MAX),
        "unix and IP; vsock, packet, alg, bluetooth and the rest are kernel attack surface no"
        " job needs, and netlink's queued replies are charged to no cgroup (an attack review:"
        " ~8 MB a socket, unbounded; glibc's getaddrinfo falls back without it, getifaddrs"
        " fails); EAFNOSUPPORT is handled",
    ),
    Rule(
        ("socketpair",),
        OneOf(0, (AF_UNIX,), EAFNOSUPPORT, known_below=AF_MAX),
        "only unix sockets come in pairs",
    ),
    Rule(
        ("setsockopt",),
        RefuseWhenAll(((1, SOL_SOCKET), (2, SO_RCVLOWAT))),
        "every option but SO_RCVLOWAT, which raises a TCP listener's receive buffer to"
        " tcp_rmem[2] (32 MiB on this VM image), past the 2 x rmem_max the TCP watch counts"
        " for each connection waiting in it: they inherit it, and the listener could shrink"
        " its own again (found 2026-12-05: ~15 waiting held ~480 MB unstopped)",
    ),
    Rule(
        ("io_setup", "io_submit", "io_getevents", "io_pgetevents", "io_cancel", "io_destroy"),
        Refuse(ENOSYS),
        "kernel async I/O contexts come from one host-wide quota (fs.aio-max-nr), not split"
        " by namespace, cgroup or uid: one job held 65,534 of 65,536 and every other job"
        " and host service got EAGAIN (a review, 2026-12-05); glibc's POSIX AIO uses"
        " threads, libaio users fall back on ENOSYS",
    ),
    Rule(
        ("memfd_secret",),
        Refuse(ENOSYS),
        "secret memory is taken out of the kernel's direct map, splitting its huge pages"
        " until reboot: a 6 MiB job split 6 GiB of 1 GiB mappings (a review)",
    ),
    Rule(
        ("fadvise64",),
        RefuseWhenAll(((3, POSIX_FADV_DONTNEED),)),
        "every advice but DONTNEED, which drops a shared host file's cached pages for every"
        " tenant (evicting others' hot files; with a probe, Evict+Reload: a review)",
    ),
    Rule(
        ("preadv2", "pwritev2"),
        FlagsClear(5, RWF_NOWAIT, EOPNOTSUPP),
        "RWF_NOWAIT tells, page by page, whether another tenant's job read a shared host"
        " file (a review); EOPNOTSUPP, as where the file system has no such reads",
    ),
    Rule(
        ("personality",),
        OneOf(0, PERSONALITIES, EPERM),
        "as moby: no ADDR_NO_RANDOMIZE and the like",
    ),
    Rule(
        ("io_uring_setup", "io_uring_enter", "io_uring_register"),
        Refuse(EPERM),
        "a large attack surface whose operations seccomp never sees (moby refuses it too)",
    ),
    Rule(("bpf",), Refuse(EPERM), "verifier and JIT bugs are kernel exploits"),
    Rule(("perf_event_open",), Refuse(EPERM), "a long list of kernel exploits; side channels"),
    Rule(("userfaultfd",), Refuse(EPERM), "stalls kernel copies at will: race-exploit helper"),
    Rule(
        ("keyctl", "add_key", "request_key"),
        Refuse(EPERM),
        "keyrings are not namespaced and outlive the job under its slot uid",
    ),
    Rule(
        _names("""
            mount umount2 pivot_root move_mount open_tree open_tree_attr
            fsopen fsconfig fsmount fspick mount_setattr
        """),
        Refuse(EPERM),
        "the job's mounts are set up for it; it has no business changing them",
    ),
    Rule(("setns",), Refuse(EPERM), "no joining other namespaces"),
    Rule(
        ("kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module"),
        Refuse(EPERM),
        "never a job's business: replacing the kernel or loading code into it",
    ),
    Rule(
        ("file_getattr", "file_setattr"),
        Refuse(ENOSYS),
        "6.17 calls moby does not list yet; as on an older kernel, programs use the ioctl",
    ),
)


def decisions(arch: Arch) -> dict[str, Decision]:
    """name -> decision for every call a rule names on ``arch``. Raises SyscallPolicyError for a
    name the arch's table does not know, or one decided twice."""
    decided: dict[str, Decision] = {}
    for rule in RULES:
        if arch.name not in rule.arches:
            continue
        for name in rule.names:
            if name not in arch.syscalls:
                raise SyscallPolicyError(f"{name}: no such system call on {arch.name}")
            if name in decided:
                raise SyscallPolicyError(f"{name}: decided twice")
            decided[name] = rule.decision
    return decided


def allowed(arch: Arch) -> set[str]:
    """The calls allowed on ``arch`` for some arguments at least."""
    return {name for name, d in decisions(arch).items() if not isinstance(d, Refuse)}


def check(arches: Iterable[Arch] = ARCHES.values()) -> None:
    for arch in arches:
        decisions(arch)
    for rule in RULES:
        unknown = set(rule.arches) - set(ARCHES)
        if unknown:
            raise SyscallPolicyError(f"{rule.names[0]}: no table for {sorted(unknown)}")
        d = rule.decision
        if isinstance(d, OneOf) and d.refuse != DEFAULT_ERRNO and d.known_below <= max(d.values):
            raise SyscallPolicyError(f"{rule.names[0]}: known_below must cover its values")
        if isinstance(d, RefuseWhenAll) and d.refuse != DEFAULT_ERRNO:
            raise SyscallPolicyError(f"{rule.names[0]}: RefuseWhenAll refuses with EPERM only")


check()  # at import: a misspelt name must never silently drop out of the filter

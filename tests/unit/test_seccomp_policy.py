"""The syscall policy and its two compilations, checked without loading anything: a small
classic-BPF interpreter (written here from the kernel's opcode values, not the compiler's)
runs the program on synthetic seccomp_data, and an evaluator of the Docker profile with
libseccomp's semantics proves both say the same."""

from __future__ import annotations

import errno
import json
import shutil
import struct
from pathlib import Path

import pytest

from sandbox_core import seccomp
from sandbox_core.seccomp import arches, bpf, policy
from sandbox_core.seccomp import gen_syscalls as gen
from sandbox_core.seccomp.arches import Arch
from sandbox_core.seccomp.docker_profile import profile as docker_profile

# linux/filter.h, linux/bpf_common.h, linux/seccomp.h, linux/audit.h
BPF_LD_W_ABS = 0x00 | 0x00 | 0x20
BPF_JA, BPF_JEQ, BPF_JGT, BPF_JGE, BPF_JSET = 0x05, 0x15, 0x25, 0x35, 0x45
BPF_RET_K = 0x06
SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO, SECCOMP_RET_DATA = 0x7FFF0000, 0x00050000, 0xFFFF
AUDIT_ARCH_X86_64, AUDIT_ARCH_AARCH64, AUDIT_ARCH_I386 = 0xC000003E, 0xC00000B7, 0x40000003
ALLOW = "allow"

CLONE_VM, CLONE_FS, CLONE_FILES, CLONE_SIGHAND = 0x100, 0x200, 0x400, 0x800
CLONE_THREAD, CLONE_SYSVSEM, CLONE_SETTLS = 0x10000, 0x40000, 0x80000
CLONE_PARENT_SETTID, CLONE_CHILD_CLEARTID, CLONE_CHILD_SETTID = 0x100000, 0x200000, 0x1000000
SIGCHLD = 17
FORK_FLAGS = SIGCHLD | CLONE_CHILD_SETTID | CLONE_CHILD_CLEARTID  # glibc's fork()
THREAD_FLAGS = CLONE_VM | CLONE_FS | CLONE_FILES | CLONE_SIGHAND | CLONE_THREAD
THREAD_FLAGS |= CLONE_SYSVSEM | CLONE_SETTLS | CLONE_PARENT_SETTID | CLONE_CHILD_CLEARTID
NAMESPACE_FLAGS = {
    "NEWNS": 0x20000,
    "NEWCGROUP": 0x2000000,
    "NEWUTS": 0x4000000,
    "NEWIPC": 0x8000000,
    "NEWUSER": 0x10000000,
    "NEWPID": 0x20000000,
    "NEWNET": 0x40000000,
}
CLONE_NEWTIME = 0x80
AF_UNIX, AF_INET, AF_INET6, AF_NETLINK, AF_PACKET, AF_ALG, AF_VSOCK = 1, 2, 10, 16, 17, 38, 40
BOTH = list(arches.ARCHES.values())


def run_bpf(program: bytes, data: bytes) -> tuple[int, int]:
    """Classic BPF, the opcodes a seccomp filter of ours may use: (return value, steps)."""
    insns = [struct.unpack_from("=HBBI", program, at) for at in range(0, len(program), 8)]
    pc = acc = steps = 0
    while True:
        assert 0 <= pc < len(insns), "ran off the program"
        code, jt, jf, k = insns[pc]
        steps += 1
        if code == BPF_LD_W_ABS:
            assert k % 4 == 0 and k + 4 <= len(data)
            acc = struct.unpack_from("=I", data, k)[0]
            pc += 1
        elif code == BPF_JA:
            pc += 1 + k
        elif code in (BPF_JEQ, BPF_JGT, BPF_JGE, BPF_JSET):
            taken = {
                BPF_JEQ: acc == k,
                BPF_JGT: acc > k,
                BPF_JGE: acc >= k,
                BPF_JSET: acc & k != 0,
            }[code]
            pc += 1 + (jt if taken else jf)
        elif code == BPF_RET_K:
            return k, steps
        else:
            raise AssertionError(f"opcode {code:#x} at {pc}")


def seccomp_data(nr: int, audit: int, args: tuple[int, ...] = ()) -> bytes:
    padded = (tuple(args) + (0,) * 6)[:6]
    return struct.pack("=IIQ6Q", nr, audit, 0x400000, *padded)  # little-endian arches only


def verdict(value: int) -> str | tuple[str, int]:
    if value == SECCOMP_RET_ALLOW:
        return ALLOW
    assert value & ~SECCOMP_RET_DATA == SECCOMP_RET_ERRNO, hex(value)
    return ("errno", value & SECCOMP_RET_DATA)


def check(arch: Arch, name: str, *args: int) -> str | tuple[str, int]:
    return check_nr(arch, arch.syscalls[name], *args)


def check_nr(arch: Arch, nr: int, *args: int, audit: int | None = None) -> str | tuple[str, int]:
    data = seccomp_data(nr, arch.audit if audit is None else audit, args)
    return verdict(run_bpf(bpf.compile_filter(arch), data)[0])


def eperm(code: int = errno.EPERM) -> tuple[str, int]:
    return ("errno", code)


@pytest.fixture(params=BOTH, ids=lambda a: a.name)
def arch(request: pytest.FixtureRequest) -> Arch:
    chosen: Arch = request.param
    return chosen


# -- the definition ------------------------------------------------------------------


def test_every_name_resolves_on_both_arches():
    for rule in policy.RULES:
        assert rule.why, rule.names
        for name_of_arch in rule.arches:
            table = arches.ARCHES[name_of_arch].syscalls
            assert [n for n in rule.names if n not in table] == [], (name_of_arch, rule.why)
    for a in BOTH:
        assert policy.decisions(a)  # raises on an unknown or twice-decided name


def test_a_misspelt_name_is_an_error_not_a_silent_drop(monkeypatch):
    bad = policy.Rule(("io_uring_setpu",), policy.Refuse(errno.EPERM), "typo")
    monkeypatch.setattr(policy, "RULES", (*policy.RULES, bad))
    with pytest.raises(policy.SyscallPolicyError, match="io_uring_setpu"):
        policy.check()
    twice = policy.Rule(("read",), policy.Refuse(errno.EPERM), "clash")
    monkeypatch.setattr(policy, "RULES", (*policy.RULES[:-1], twice))
    with pytest.raises(policy.SyscallPolicyError, match="twice"):
        policy.check()


def test_tables_agree_with_known_numbers():
    x86, arm = arches.X86_64.syscalls, arches.AARCH64.syscalls
    assert (x86["read"], x86["clone"], x86["socket"], x86["bpf"]) == (0, 56, 41, 321)
    assert (arm["read"], arm["clone"], arm["socket"], arm["bpf"]) == (63, 220, 198, 280)
    for table in (x86, arm):
        assert table["io_uring_setup"] == 425 and table["clone3"] == 435
        assert table["cachestat"] == 451 and table["mseal"] == 462
        assert table["file_setattr"] == 469
    assert "open" in x86 and "open" not in arm  # aarch64 has only the *at calls


def test_refusals_asked_for_are_not_allowed(arch):
    allowed = policy.allowed(arch)
    refused = (
        "io_uring_setup io_uring_enter io_uring_register bpf perf_event_open userfaultfd"
        " keyctl add_key request_key mount umount2 pivot_root move_mount open_tree fsopen"
        " fsconfig fsmount fspick mount_setattr setns kexec_load kexec_file_load"
        " init_module finit_module delete_module clone3"
    )
    assert allowed.isdisjoint(refused.split(" "))


# -- the BPF program -----------------------------------------------------------------


def test_program_fits_the_kernel_limits(arch):
    program = bpf.compile_filter(arch)
    assert len(program) % 8 == 0 and 0 < len(program) // 8 <= 4096
    worst = max(
        run_bpf(program, seccomp_data(nr, arch.audit, (0x7FFFFFFF, 0, 0)))[1]
        for nr in range(arch.highest + 2)
    )
    assert worst <= 20  # prologue + ~log2(runs) + an argument check, not a linear scan


@pytest.mark.parametrize("name", ["read", "write", "execve", "mmap", "openat", "exit_group"])
def test_ordinary_calls_are_allowed(arch, name):
    assert check(arch, name) == ALLOW


@pytest.mark.parametrize(
    "name", ["io_uring_setup", "bpf", "perf_event_open", "keyctl", "mount", "setns", "reboot"]
)
def test_dangerous_calls_get_eperm(arch, name):
    assert check(arch, name) == eperm()


def test_sockets(arch):
    sock_stream = 1
    assert check(arch, "socket", AF_VSOCK, sock_stream, 0) == eperm(errno.EAFNOSUPPORT)
    for family in (AF_PACKET, AF_ALG, 0, 31, 45, 46, 0xFFFF):
        assert check(arch, "socket", family, sock_stream, 0) == eperm(errno.EAFNOSUPPORT)
    for family in (AF_UNIX, AF_INET, AF_INET6):
        assert check(arch, "socket", family, sock_stream, 0) == ALLOW
    for protocol in (0, 4):  # NETLINK_ROUTE, SOCK_DIAG: replies no cgroup is charged for
        assert check(arch, "socket", AF_NETLINK, 3, protocol) == eperm(errno.EAFNOSUPPORT)
    assert check(arch, "socketpair", AF_UNIX, sock_stream, 0) == ALLOW
    assert check(arch, "socketpair", AF_INET, sock_stream, 0) == eperm(errno.EAFNOSUPPORT)
    # The kernel reads the family as an int: a stray high word changes nothing it does.
    assert check(arch, "socket", (1 << 32) | AF_INET, sock_stream, 0) == ALLOW
    assert check(arch, "socket", (1 << 32) | AF_VSOCK, 1, 0) == eperm(errno.EAFNOSUPPORT)


def test_clone_and_unshare(arch):
    assert check(arch, "clone", FORK_FLAGS) == ALLOW
    assert check(arch, "clone", THREAD_FLAGS) == ALLOW
    assert check(arch, "clone", SIGCHLD) == ALLOW
    for flag in NAMESPACE_FLAGS.values():
        assert check(arch, "clone", FORK_FLAGS | flag) == eperm(), hex(flag)
        assert check(arch, "unshare", flag) == eperm(), hex(flag)
    assert check(arch, "unshare", CLONE_NEWTIME) == eperm()
    assert check(arch, "unshare", CLONE_FILES | CLONE_FS) == ALLOW
    assert check(arch, "clone3") == eperm(errno.ENOSYS)


def test_personality(arch):
    for persona in (0, 8, 0x20000, 0x20008, 0xFFFFFFFF):
        assert check(arch, "personality", persona) == ALLOW
    assert check(arch, "personality", 0x0040000) == eperm()  # ADDR_NO_RANDOMIZE


def test_setsockopt_refuses_only_so_rcvlowat(arch):
    sol_socket, ipproto_tcp, so_rcvbuf, so_rcvlowat = 1, 6, 8, 18
    assert check(arch, "setsockopt", 3, sol_socket, so_rcvlowat) == eperm()
    # The kernel reads level and optname as ints: a stray high word is still SO_RCVLOWAT.
    assert check(arch, "setsockopt", 3, (1 << 32) | sol_socket, so_rcvlowat) == eperm()
    assert check(arch, "setsockopt", 3, sol_socket, (7 << 32) | so_rcvlowat) == eperm()
    assert check(arch, "setsockopt", 3, sol_socket, so_rcvbuf) == ALLOW
    assert check(arch, "setsockopt", 3, ipproto_tcp, so_rcvlowat) == ALLOW  # TCP_USER_TIMEOUT
    assert check(arch, "setsockopt", 3, sol_socket | 0x100, so_rcvlowat) == ALLOW


def test_host_wide_quotas_and_shared_page_cache_are_out_of_reach(arch):
    for name in ("io_setup", "io_submit", "io_getevents", "io_destroy", "memfd_secret"):
        assert check(arch, name) == eperm(errno.ENOSYS), name
    dontneed, willneed, rwf_nowait, rwf_hipri = 4, 3, 0x8, 0x1
    assert check(arch, "fadvise64", 3, 0, 0, dontneed) == eperm()
    assert check(arch, "fadvise64", 3, 0, 0, (1 << 32) | dontneed) == eperm()
    assert check(arch, "fadvise64", 3, 0, 0, willneed) == ALLOW
    for name in ("preadv2", "pwritev2"):
        assert check(arch, name, 3, 0, 1, 0, 0, rwf_nowait) == eperm(errno.EOPNOTSUPP)
        assert check(arch, name, 3, 0, 1, 0, 0, rwf_nowait | rwf_hipri) == eperm(errno.EOPNOTSUPP)
        assert check(arch, name, 3, 0, 1, 0, 0, rwf_hipri) == ALLOW


def test_numbers_outside_the_policy(arch):
    above = arch.highest + 1
    assert check_nr(arch, above) == eperm(errno.ENOSYS)
    assert check_nr(arch, 1000) == eperm(errno.ENOSYS)
    assert check_nr(arch, 0xFFFFFFFF) == eperm(errno.ENOSYS)  # nr -1
    gap = 400  # in neither table
    assert check_nr(arch, gap) == eperm(errno.ENOSYS)
    assert check(arch, "chroot") == eperm()  # in the table, in no rule: the default


def test_other_abis_are_refused(arch):
    getpid = arch.syscalls["getpid"]
    other = AUDIT_ARCH_AARCH64 if arch.audit == AUDIT_ARCH_X86_64 else AUDIT_ARCH_X86_64
    for audit in (AUDIT_ARCH_I386, other, 0):
        assert check_nr(arch, getpid, audit=audit) == eperm(errno.ENOSYS)
    if arch.name == "x86_64":
        assert check_nr(arch, 0x40000000 | 39) == eperm(errno.ENOSYS)  # x32 getpid


def test_job_filter_is_the_native_program():
    native = arches.native()
    expected = bpf.compile_filter(native) if native else None
    assert seccomp.job_filter() == expected


# -- the assembler's long jumps ------------------------------------------------------


@pytest.mark.parametrize("far", ["jt", "jf", "both"])
def test_jumps_past_255_go_through_trampolines(far):
    ld, ret = bpf.Stmt(BPF_LD_W_ABS, 0), bpf.Stmt(BPF_RET_K, SECCOMP_RET_ERRNO | 2)
    filler = [bpf.Stmt(BPF_RET_K, SECCOMP_RET_ERRNO | 3)] * 300
    near, away = "near", "away"
    jt, jf = {"jt": (away, None), "jf": (None, away), "both": (away, near)}[far]
    items: list[bpf.Item] = [ld, bpf.Jump(BPF_JEQ, 7, jt, jf), ret, *filler]
    if far == "both":
        items += [bpf.Label(near), bpf.Stmt(BPF_RET_K, SECCOMP_RET_ERRNO | 4), *filler]
    items += [bpf.Label(away), bpf.Stmt(BPF_RET_K, SECCOMP_RET_ALLOW)]
    program = bpf.assemble(items)
    data = {nr: seccomp_data(nr, 0) for nr in (7, 8)}
    taken, not_taken = (verdict(run_bpf(program, data[nr])[0]) for nr in (7, 8))
    expected = {"jt": (ALLOW, eperm(2)), "jf": (eperm(2), ALLOW), "both": (ALLOW, eperm(4))}
    assert (taken, not_taken) == expected[far]


# -- the Docker profile --------------------------------------------------------------


def _matches(arg: dict, value: int) -> bool:
    op, v, v2 = arg["op"], arg["value"], arg.get("valueTwo", 0)
    outcomes: dict[str, bool] = {
        "SCMP_CMP_EQ": value == v,
        "SCMP_CMP_NE": value != v,
        "SCMP_CMP_GE": value >= v,
        "SCMP_CMP_MASKED_EQ": value & v == v2,
    }
    return outcomes[op]


def docker_verdict(profile: dict, arch: Arch, name: str, args: tuple[int, ...]):
    """libseccomp's answer: the matching rule's action (ours never overlap), or the default."""
    found: set[str | tuple[str, int]] = set()
    for entry in profile["syscalls"]:
        includes = entry.get("includes", {}).get("arches")
        if name not in entry["names"] or (includes and arch.docker not in includes):
            continue
        assert not entry.get("excludes")
        if all(_matches(a, args[a["index"]]) for a in entry.get("args", [])):
            if entry["action"] == "SCMP_ACT_ALLOW":
                found.add(ALLOW)
            else:
                assert entry["action"] == "SCMP_ACT_ERRNO"
                found.add(("errno", entry["errnoRet"]))
    assert len(found) <= 1, (name, args, found)
    return found.pop() if found else ("errno", profile["defaultErrnoRet"])


def _probe_args() -> list[tuple[int, ...]]:
    first = [*range(50), FORK_FLAGS, THREAD_FLAGS, CLONE_NEWTIME, 0x20000, 0x20008]
    first += [*NAMESPACE_FLAGS.values(), 0x40000, 0xFFFFFFFF, 0x7FFFFFFF]
    seconds = (0, 1, 6, 0x101, (1 << 32) | 1)
    thirds = (0, 4, 18, 19, 0x112, (1 << 32) | 18)
    probes = [(a0, a1, a2, 0, 0, 0) for a0 in first for a1 in seconds for a2 in thirds]
    fourths, sixths = (0, 4, 5, (1 << 32) | 4), (0, 8, 9, (1 << 32) | 8, 1 << 35)
    return probes + [(3, 0, 0, a3, 0, a5) for a3 in fourths for a5 in sixths]


def test_docker_profile_is_valid_json_of_the_right_shape():
    profile = json.loads(seccomp.docker_profile())
    assert profile["defaultAction"] == "SCMP_ACT_ERRNO" and profile["defaultErrnoRet"] == 1
    assert profile["architectures"] == ["SCMP_ARCH_X86_64", "SCMP_ARCH_AARCH64"]
    for entry in profile["syscalls"]:
        indexes = [a["index"] for a in entry.get("args", [])]
        assert len(indexes) == len(set(indexes)), entry  # runc ORs, not ANDs, repeats
    clone3 = [e for e in profile["syscalls"] if e["names"] == ["clone3"]]
    assert [(e["action"], e["errnoRet"]) for e in clone3] == [("SCMP_ACT_ERRNO", 38)]


def test_docker_profile_allows_the_same_set(arch):
    profile = docker_profile()
    named = {
        name
        for entry in profile["syscalls"]
        if entry["action"] == "SCMP_ACT_ALLOW"
        and arch.docker in entry.get("includes", {}).get("arches", [arch.docker])
        for name in entry["names"]
    }
    assert named == policy.allowed(arch)


def test_docker_profile_decides_every_call_as_the_filter_does(arch):
    profile = docker_profile()
    program = bpf.compile_filter(arch)
    decided = policy.decisions(arch)
    probes = _probe_args()
    for name, nr in arch.syscalls.items():
        conditional = not isinstance(decided.get(name), policy.Allow | policy.Refuse | None)
        for args in probes if conditional else probes[:1]:
            ours = verdict(run_bpf(program, seccomp_data(nr, arch.audit, args))[0])
            assert docker_verdict(profile, arch, name, args) == ours, (name, args)


def test_tables_are_what_the_generator_makes_from_the_headers():
    headers = (gen.X86_64_HEADER, gen.GENERIC_HEADER)
    if shutil.which("cc") is None or not all(Path(h).exists() for h in headers):
        pytest.skip("no C preprocessor or no Linux UAPI headers here")
    x86 = gen.with_newer(gen.table_from_header(gen.X86_64_HEADER), "x86_64")
    arm = gen.with_newer(gen.table_from_header(gen.GENERIC_HEADER, gen.AARCH64_WANTS), "aarch64")
    assert (x86, arm) == (dict(arches.X86_64.syscalls), dict(arches.AARCH64.syscalls))

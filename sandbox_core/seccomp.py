"""A small seccomp filter for L1 jobs: no new user namespaces, no kernel keyrings.

An unprivileged user namespace gives a job every capability inside it (and with them
the kernel attack surface — nf_tables and the like — that many privilege escalations
need); keyrings outlive the job under its slot uid. bwrap blocks the first with
--disable-userns, Docker's default profile blocks both. This builds the classic BPF
program once; the exec helper (or the Python fallback) loads it just before exec.
"""

from __future__ import annotations

import ctypes
import errno
import platform
import struct
from functools import cache

_LD_W_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_ALLOW = 0x7FFF0000
_ERRNO = 0x00050000
CLONE_NEWUSER = 0x10000000

# arch: (AUDIT_ARCH, {name: number})
_ARCHES = {
    "x86_64": (
        0xC000003E,
        {
            "unshare": 272,
            "clone": 56,
            "clone3": 435,
            "add_key": 248,
            "request_key": 249,
            "keyctl": 250,
        },
    ),
    "aarch64": (
        0xC00000B7,
        {
            "unshare": 97,
            "clone": 220,
            "clone3": 435,
            "add_key": 217,
            "request_key": 218,
            "keyctl": 219,
        },
    ),
}


def _assemble(program: list[tuple]) -> bytes:
    """(op, k, jt_label, jf_label) or ("label", name) -> struct sock_filter[]."""
    labels, index = {}, 0
    for item in program:
        if item[0] == "label":
            labels[item[1]] = index
        else:
            index += 1
    out, index = [], 0
    for item in program:
        if item[0] == "label":
            continue
        op, k, jt, jf = (*item, None, None)[:4]
        jt_off = labels[jt] - index - 1 if jt else 0
        jf_off = labels[jf] - index - 1 if jf else 0
        out.append(struct.pack("=HBBI", op, jt_off, jf_off, k))
        index += 1
    return b"".join(out)


@cache
def job_filter() -> bytes | None:
    """The filter for this machine's architecture, or None where it is not known."""
    arch = _ARCHES.get(platform.machine())
    if arch is None:
        return None
    audit_arch, nr = arch
    return _assemble(
        [
            (_LD_W_ABS, 4),  # seccomp_data.arch
            (_JEQ, audit_arch, "native", "enosys"),  # other ABIs (i386 via int 0x80): no
            ("label", "native"),
            (_LD_W_ABS, 0),  # seccomp_data.nr
            (_JGE, 0x40000000, "enosys", "checks"),  # x32 ABI numbers
            ("label", "checks"),
            (_JEQ, nr["unshare"], "flags", None),
            (_JEQ, nr["clone"], "flags", None),
            (_JEQ, nr["clone3"], "enosys", None),  # flags behind a pointer: glibc falls back
            (_JEQ, nr["add_key"], "eperm", None),
            (_JEQ, nr["request_key"], "eperm", None),
            (_JEQ, nr["keyctl"], "eperm", None),
            (_RET, _ALLOW),
            ("label", "flags"),
            (_LD_W_ABS, 16),  # args[0], low 32 bits: the clone/unshare flags
            (_JSET, CLONE_NEWUSER, "eperm", None),
            (_RET, _ALLOW),
            ("label", "eperm"),
            (_RET, _ERRNO | errno.EPERM),
            ("label", "enosys"),
            (_RET, _ERRNO | errno.ENOSYS),
        ]
    )


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def load(program: bytes) -> None:
    """Install ``program`` on this thread (after no_new_privs); the Python fallback path."""
    buffer = ctypes.create_string_buffer(program, len(program))
    fprog = _SockFprog(len(program) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(22, 2, ctypes.byref(fprog), 0, 0) != 0:  # PR_SET_SECCOMP, FILTER
        raise OSError(ctypes.get_errno(), "seccomp")

"""The jobs' syscall filter: an allowlist, one policy (policy.py) compiled two ways.

Allowed: what moby's default Docker profile allows an unprivileged container, the calls
ordinary programs use. Refused, beyond it or as it does: new namespaces (clone/unshare
namespace flags, setns: a user namespace hands out every capability, and with them the
kernel attack surface most privilege escalations need), io_uring, bpf, perf_event_open,
userfaultfd (kernel exploit surface and helpers), kernel keyrings (not namespaced; they
outlive the job under its slot uid), mount calls, kexec and module loading, and sockets
other than unix and IP (netlink, vsock, packet, alg, ...: EAFNOSUPPORT). Other
ABIs (i386, x32) are refused; clone3 gets ENOSYS, so glibc falls back to clone.

``job_filter()`` is the classic BPF program the process backend's exec helper (or the
Python fallback, ``load``) installs just before exec; bwrap takes the same program with
``--seccomp FD``. ``docker_profile()`` is the same policy for ``--security-opt seccomp=``.
"""

from __future__ import annotations

import ctypes
from functools import cache

from sandbox_core.seccomp import arches, bpf
from sandbox_core.seccomp.docker_profile import profile_json

_libc = ctypes.CDLL(None, use_errno=True)
# Looked up now: in a child forked from a threaded worker, dlsym could wait forever on
# a loader lock some other thread held at fork time.
_prctl = _libc.prctl
_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 22, 2


@cache
def job_filter() -> bytes | None:
    """The filter for this machine's architecture, or None where no table is known."""
    arch = arches.native()
    return bpf.compile_filter(arch) if arch is not None else None


@cache
def docker_profile() -> str:
    """The policy as Docker seccomp profile JSON. (This function shadows the submodule of
    the same name here; reach the module with ``from sandbox_core.seccomp.docker_profile``.)"""
    return profile_json()


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def load(program: bytes) -> None:
    """Install ``program`` on the calling thread (after no_new_privs): the Python fallback."""
    buffer = ctypes.create_string_buffer(program, len(program))
    fprog = _SockFprog(len(program) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    if _prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "seccomp")

"""Landlock scopes for a local job: no abstract Unix socket made outside it.

Abstract Unix sockets have no file and no owner: anyone in the same network namespace
may connect to one. A network job on L1/L2 shares the host's namespace, so through them
it reached every other network job running at once, and the host's daemons that listen
there. Through such a socket two jobs passed each other descriptors: a review
(2026-12-05) had one job hand a TCP listener to another, which filled it with ~207 MB of
connections counted for neither. Landlock's ``LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET``
(Linux 6.12, Landlock ABI 6) refuses a connection or datagram to such a socket made by
a process outside the job's domain (EPERM); the job's own processes still reach each
other's. Every L1/L2 job gets it where the kernel has it (a job without network has a
namespace of its own, where it changes nothing); ``sandfarm doctor`` says where not.
Applied by sandfarm-exec (``--landlock-scope``) or by ``scope`` in the Python fallback,
after no_new_privs.
"""

from __future__ import annotations

import ctypes
import functools
import os
import struct

SCOPE_ABSTRACT_UNIX_SOCKET = 1
_SCOPES_FROM_ABI = 6
_CREATE_RULESET, _RESTRICT_SELF = 444, 446  # the same on x86_64 and aarch64
_CREATE_RULESET_VERSION = 1
# struct landlock_ruleset_attr: handled_access_fs, handled_access_net, scoped
_RULESET_ATTR = struct.Struct("=QQQ")

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


@functools.cache
def abi() -> int:
    """The kernel's Landlock ABI version; 0 where it has none or has it switched off."""
    version = _libc.syscall(_CREATE_RULESET, None, ctypes.c_size_t(0), _CREATE_RULESET_VERSION)
    return max(int(version), 0)


def scopes_abstract_unix() -> bool:
    return abi() >= _SCOPES_FROM_ABI


def why_unscoped() -> str | None:
    """Why jobs are not scoped here, or None: they are."""
    version = abi()
    if version >= _SCOPES_FROM_ABI:
        return None
    if version == 0:
        return "no Landlock in this kernel (or not in its lsm= list)"
    return f"Landlock ABI {version} has no scopes (needs {_SCOPES_FROM_ABI}: Linux 6.12)"


def scope(scoped: int) -> None:
    """Put the calling process in a Landlock domain with these scopes and no access
    rights (after no_new_privs). OSError where the kernel refuses."""
    attr = ctypes.create_string_buffer(_RULESET_ATTR.pack(0, 0, scoped))
    fd = _libc.syscall(_CREATE_RULESET, attr, ctypes.c_size_t(_RULESET_ATTR.size), 0)
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"landlock_create_ruleset: {os.strerror(err)}")
    try:
        if _libc.syscall(_RESTRICT_SELF, ctypes.c_int(fd), 0) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"landlock_restrict_self: {os.strerror(err)}")
    finally:
        os.close(fd)

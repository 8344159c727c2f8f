"""Landlock for a local job: no Unix socket shared with another job to pass descriptors.

Two jobs that share a Unix socket pass each other descriptors, and a descriptor passed
escapes what the farm counts by job: a review (2026-12-05) had one network job hand a
TCP listener to another, which filled it with ~207 MB of connections counted for
neither. Two ways to meet, both closed here:

- **Abstract sockets** have no file and no owner: anyone in the same network namespace
  connects. A network job on L1/L2 shares the host's, so it reached every other network
  job running at once, and the host's daemons listening there.
  ``LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET`` (Linux 6.12, Landlock ABI 6) refuses a
  connection or datagram to one made outside the job's domain (EPERM); the job's own
  processes still reach each other's. Every L1/L2 job gets it where the kernel has it
  (a job without network has a namespace of its own, where it changes nothing).
- **Socket files** in a directory two jobs can write: a process job sees the host's
  files, where any world-writable directory outside its private ones (``/tmp`` and the
  like; a review found 13 a test had left) was a meeting point, network or not. With
  ``LANDLOCK_ACCESS_FS_MAKE_SOCK`` handled, a job makes socket files only beneath the
  directories given: its workspace and its private tmpfs. ``LANDLOCK_ACCESS_FS_REFER``
  is granted everywhere (ABI 2), else a file could not move to another directory; a
  socket file still cannot move where it could not be made. (bwrap shows a job no
  writable host directory.)

``sandfarm doctor`` says where the kernel has neither. Applied by sandfarm-exec
(``--landlock-scope``, ``--landlock-sock-dir``) or by ``restrict`` in the Python
fallback, after no_new_privs.
"""

from __future__ import annotations

import ctypes
import functools
import os
import struct
from collections.abc import Sequence

SCOPE_ABSTRACT_UNIX_SOCKET = 1
_SCOPES_FROM_ABI = 6
_MAKE_SOCK, _REFER = 1 << 9, 1 << 13  # LANDLOCK_ACCESS_FS_MAKE_SOCK, _REFER
_PATH_BENEATH = 1
_CREATE_RULESET, _ADD_RULE, _RESTRICT_SELF = 444, 445, 446  # x86_64 and aarch64 alike
_CREATE_RULESET_VERSION = 1
# struct landlock_ruleset_attr: handled_access_fs, handled_access_net, scoped (an older
# ABI's kernel takes it while scoped is 0)
_RULESET_ATTR = struct.Struct("=QQQ")
_PATH_BENEATH_ATTR = struct.Struct("=Qi")  # allowed_access, parent_fd (packed)

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


@functools.cache
def abi() -> int:
    """The kernel's Landlock ABI version; 0 where it has none or has it switched off."""
    version = _libc.syscall(_CREATE_RULESET, None, ctypes.c_size_t(0), _CREATE_RULESET_VERSION)
    return max(int(version), 0)


def scopes_abstract_unix() -> bool:
    return abi() >= _SCOPES_FROM_ABI


def bounds_socket_files() -> bool:
    """ABI 2: a ruleset that handles any file right refuses every move or link of a file
    to another directory (EXDEV: ``git mv`` failed, a review) unless it grants
    ``LANDLOCK_ACCESS_FS_REFER``, which ABI 1 does not have."""
    return abi() >= 2


def why_unscoped() -> str | None:
    """Why jobs are not scoped here, or None: they are."""
    version = abi()
    if version >= _SCOPES_FROM_ABI:
        return None
    if version == 0:
        return "no Landlock in this kernel (or not in its lsm= list)"
    return f"Landlock ABI {version} has no scopes (needs {_SCOPES_FROM_ABI}: Linux 6.12)"


def _failed(call: str) -> OSError:
    err = ctypes.get_errno()
    return OSError(err, f"{call}: {os.strerror(err)}")


def restrict(scoped: int, sock_dirs: Sequence[str] = ()) -> None:
    """Put the calling process in a Landlock domain with these scopes and, given any
    ``sock_dirs``, socket files made only beneath them, files moved and linked anywhere
    as before (after no_new_privs). OSError where the kernel refuses."""
    handled = _MAKE_SOCK | _REFER if sock_dirs else 0
    attr = ctypes.create_string_buffer(_RULESET_ATTR.pack(handled, 0, scoped))
    fd = _libc.syscall(_CREATE_RULESET, attr, ctypes.c_size_t(_RULESET_ATTR.size), 0)
    if fd < 0:
        raise _failed("landlock_create_ruleset")
    rules = [("/", _REFER)] if sock_dirs else []
    try:
        for path, allowed in [*rules, *((path, _MAKE_SOCK) for path in sock_dirs)]:
            parent = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:
                rule = ctypes.create_string_buffer(_PATH_BENEATH_ATTR.pack(allowed, parent))
                if _libc.syscall(_ADD_RULE, ctypes.c_int(fd), _PATH_BENEATH, rule, 0) != 0:
                    raise _failed(f"landlock_add_rule {path}")
            finally:
                os.close(parent)
        if _libc.syscall(_RESTRICT_SELF, ctypes.c_int(fd), 0) != 0:
            raise _failed("landlock_restrict_self")
    finally:
        os.close(fd)

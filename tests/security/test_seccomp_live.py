"""job_filter() loaded for real, in a forked child (no sandbox backend involved).

Every refusal is first tried WITHOUT the filter (the positive control): a check whose
attack the kernel refuses anyway proves nothing, and is skipped with the reason."""

from __future__ import annotations

import ctypes
import errno
import json
import os
import platform
import socket
import subprocess
import sys
from collections.abc import Callable
from functools import cache
from typing import Any

import pytest

from sandbox_core import seccomp
from sandbox_core.seccomp import arches

pytestmark = pytest.mark.skipif(seccomp.job_filter() is None, reason="no filter for this arch")

_PR_SET_NO_NEW_PRIVS = 38
AF_VSOCK = 40
CLONE_NEWUSER = 0x10000000
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
SNIPPET = r"""
import asyncio, json, multiprocessing, socket, ssl, subprocess, sys, threading
done = {}
done["subprocess"] = subprocess.run(
    [sys.executable, "-c", "print(2)"], capture_output=True, text=True, check=True
).stdout.strip()
box = []
thread = threading.Thread(target=box.append, args=("thread",))
thread.start()
thread.join()
done["thread"] = box[0]
async def main():
    proc = await asyncio.create_subprocess_exec("true")
    return await proc.wait()
done["asyncio"] = asyncio.run(main())
done["ssl"] = ssl.create_default_context().verify_mode.name
server = socket.create_server(("127.0.0.1", 0))
server.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
client = socket.create_connection(server.getsockname())
client.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, 5000)  # optname 18, as SO_RCVLOWAT
done["tcp"] = client.getsockname()[0]
client.close()
server.close()
try:
    socket.if_nameindex()  # netlink: refused (its replies are charged to no cgroup)
except OSError as exc:
    done["interfaces"] = exc.errno
# glibc's getaddrinfo asks netlink which families are configured, and falls back
done["resolve"] = len(socket.getaddrinfo("localhost", 80, flags=socket.AI_ADDRCONFIG))
with multiprocessing.Pool(2) as pool:
    done["pool"] = pool.map(abs, [-1, -2])
print(json.dumps(done))
"""


def _errno_of(call: Callable[[], Any]) -> int:
    try:
        call()
    except OSError as exc:
        return exc.errno or -1
    return 0


def _syscall(nr: int, *args: Any) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    if libc.syscall(ctypes.c_long(nr), *args) == -1:
        return ctypes.get_errno()
    return 0


def _attacks() -> dict[str, int]:
    """errno of each attack (0: it worked)."""
    table = arches.native().syscalls  # type: ignore[union-attr]  # pytestmark skips None
    params = ctypes.create_string_buffer(120)  # struct io_uring_params, zeroed
    attr = ctypes.create_string_buffer(128)  # union bpf_attr, zeroed
    libc = ctypes.CDLL(None, use_errno=True)
    return {
        "vsock": _errno_of(lambda: socket.socket(AF_VSOCK, socket.SOCK_STREAM).close()),
        "io_uring_setup": _syscall(table["io_uring_setup"], 1, params),
        "unshare_newuser": 0 if libc.unshare(CLONE_NEWUSER) == 0 else ctypes.get_errno(),
        "bpf": _syscall(table["bpf"], 0, attr, 128),  # BPF_MAP_CREATE
        "keyctl": _syscall(table["keyctl"], 0, -4, 0),  # KEYCTL_GET_KEYRING_ID, user ring
        "so_rcvlowat": _errno_of(_raise_receive_low_water),
        "io_setup": _syscall(table["io_setup"], 1, ctypes.byref(ctypes.c_ulong(0))),
        "memfd_secret": _syscall(table["memfd_secret"], 0),
        "fadvise_dontneed": _errno_of(_drop_cached_pages),
        "preadv2_nowait": _errno_of(_probe_cached_page),
    }


def _drop_cached_pages() -> None:
    """POSIX_FADV_DONTNEED on a host file any job may read: its cached pages go for all."""
    fd = os.open("/etc/hostname", os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _probe_cached_page() -> None:
    """RWF_NOWAIT: a read that fails rather than wait for the disk tells whether the page
    was cached (whether another job read it)."""
    fd = os.open("/etc/hostname", os.O_RDONLY)
    try:
        os.pread(fd, 64, 0)  # cached now: the probe answers at once
        os.preadv(fd, [bytearray(64)], 0, os.RWF_NOWAIT)
    finally:
        os.close(fd)


def _raise_receive_low_water() -> None:
    """SO_RCVLOWAT on a TCP listener: its receive buffer grows to tcp_rmem[2], and every
    connection waiting in it inherits that (tcpwatch.py counts 2 x rmem_max a one)."""
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 1 << 30)


def _programs() -> dict[str, Any]:
    python = subprocess.run([PYTHON, "-c", SNIPPET], capture_output=True, text=True)
    bash = subprocess.run(["/bin/bash", "-c", "ls / | wc -l"], capture_output=True, text=True)
    return {
        "python": [python.returncode, python.stdout, python.stderr[-2000:]],
        "bash": [bash.returncode, bash.stdout, bash.stderr[-2000:]],
    }


def in_child(work: Callable[[], dict[str, Any]], *, filtered: bool) -> dict[str, Any]:
    """Run ``work`` in a forked child, under job_filter() if ``filtered``; its JSON result."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        code = 1
        try:
            os.close(read_end)
            if filtered:
                libc = ctypes.CDLL(None, use_errno=True)
                if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
                    raise OSError(ctypes.get_errno(), "no_new_privs")
                seccomp.load(seccomp.job_filter() or b"")
            result = work()
            code = 0
        except BaseException as exc:
            result = {"error": repr(exc)}
        with os.fdopen(write_end, "w") as out:
            json.dump(result, out)
        os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end) as got:
        text = got.read()
    _, status = os.waitpid(pid, 0)
    if not text:
        raise ChildDied(f"wait status {status:#x}")
    reported: dict[str, Any] = json.loads(text)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, reported
    return reported


class ChildDied(Exception):
    """The child was killed before it could report (a signal, e.g. SIGSEGV)."""


@cache
def control() -> dict[str, Any]:
    return in_child(_attacks, filtered=False)


@cache
def filtered() -> dict[str, Any]:
    return in_child(_attacks, filtered=True)


def test_ordinary_programs_run_under_the_filter():
    ran = in_child(_programs, filtered=True)
    code, out, err = ran["python"]
    assert code == 0, err
    done = json.loads(out)
    assert done["subprocess"] == "2" and done["thread"] == "thread" and done["asyncio"] == 0
    assert done["tcp"] == "127.0.0.1" and done["pool"] == [1, 2] and done["resolve"] >= 1
    assert done["interfaces"] == errno.EAFNOSUPPORT  # a clean error, no crash
    code, out, err = ran["bash"]
    assert code == 0 and int(out) > 3, err


@pytest.mark.parametrize(
    ("attack", "refused_with", "kernel_lacks"),
    [
        ("vsock", errno.EAFNOSUPPORT, "this kernel has no vsock (AF_VSOCK)"),
        ("io_uring_setup", errno.EPERM, "io_uring is off here (kernel.io_uring_disabled)"),
        ("unshare_newuser", errno.EPERM, "user namespaces are off here"),
        ("bpf", errno.EPERM, "bpf() is off for this user (unprivileged_bpf_disabled)"),
        ("keyctl", errno.EPERM, "this kernel has no keyrings"),
        ("so_rcvlowat", errno.EPERM, "this kernel refuses SO_RCVLOWAT"),
        ("io_setup", errno.ENOSYS, "this kernel has no async I/O (CONFIG_AIO)"),
        ("memfd_secret", errno.ENOSYS, "secret memory is off here (secretmem.enable)"),
        ("fadvise_dontneed", errno.EPERM, "this kernel refuses fadvise"),
        ("preadv2_nowait", errno.EOPNOTSUPP, "this file system has no RWF_NOWAIT reads"),
    ],
)
def test_attack_works_without_the_filter_and_fails_with_it(attack, refused_with, kernel_lacks):
    unfiltered = control()[attack]
    if unfiltered in (errno.EPERM, errno.EAFNOSUPPORT, errno.ENOSYS, errno.EACCES):
        pytest.skip(f"{kernel_lacks}: {os.strerror(unfiltered)} without the filter")
    # It worked, or failed only on our dummy arguments (EINVAL): the call reached the kernel.
    assert unfiltered in (0, errno.EINVAL, errno.EFAULT), os.strerror(unfiltered)
    assert filtered()[attack] == refused_with, os.strerror(filtered()[attack])


def _x32_getpid() -> dict[str, Any]:
    return {"x32": _syscall(0x40000000 | 39)}


@pytest.mark.skipif(platform.machine() != "x86_64", reason="x32 is an x86_64 ABI")
def test_x32_calls_are_refused():
    if in_child(_x32_getpid, filtered=False)["x32"] != 0:
        pytest.skip("this kernel has no x32 ABI (CONFIG_X86_X32_ABI)")
    assert in_child(_x32_getpid, filtered=True)["x32"] == errno.ENOSYS


def _int80_getpid() -> dict[str, Any]:
    """getpid through the i386 ABI (int 0x80, eax 20), from a page of machine code."""
    import mmap

    code = bytes.fromhex("53b814000000cd805bc3")  # push rbx; mov eax,20; int 0x80
    page = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    page.write(code)
    address = ctypes.addressof(ctypes.c_char.from_buffer(page))
    result = ctypes.CFUNCTYPE(ctypes.c_int)(address)()
    return {"int80": result, "pid": os.getpid()}


@pytest.mark.skipif(platform.machine() != "x86_64", reason="int 0x80 is x86")
def test_i386_calls_are_refused():
    try:
        plain = in_child(_int80_getpid, filtered=False)
    except ChildDied:
        pytest.skip("this kernel has no i386 emulation (the int 0x80 child died)")
    if plain["int80"] != plain["pid"]:
        pytest.skip(f"int 0x80 getpid gave {plain['int80']} without the filter")
    assert in_child(_int80_getpid, filtered=True)["int80"] == -errno.ENOSYS

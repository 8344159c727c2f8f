"""The TCP listeners of the calling thread's network namespace, through sock_diag.

For each listener: its owner's uid, how many connections wait in its accept queue
(``idiag_rqueue`` of a listener), and its receive buffer, which each waiting connection
inherits and may fill (``SK_MEMINFO_RCVBUF``). Used by tcpwatch.py, whose reason is in
its docstring. sock_diag, not /proc/net/tcp: the table has no buffer sizes, and the
kernel walks it again from a bucket's start at each 4 KiB read (15,500 listeners on one
port cost the worker 200 ms a read, an attack review). Written out here, as
loopback.py is: one request a family, and four fields of each answer.
"""

from __future__ import annotations

import errno
import os
import socket
import struct
from dataclasses import dataclass

_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST, _NLM_F_DUMP = 0x1, 0x300
_NLMSG_ERROR, _NLMSG_DONE = 2, 3
_TCP_LISTEN = 10
_INET_DIAG_SKMEMINFO = 7
_SK_MEMINFO_RCVBUF = 1
_NLMSGHDR = struct.Struct("=IHHII")  # length, type, flags, sequence, port
# inet_diag_req_v2: family, protocol, extensions, pad, states, then a zero socket id
_REQUEST = struct.Struct("=BBBxI48x")
# inet_diag_msg: family, state, timer, retransmits, socket id (48), expires, rqueue,
# wqueue, uid, inode
_MESSAGE = struct.Struct("=BBBB48xIIIII")
_ATTR = struct.Struct("=HH")  # length, type
_RECV_BYTES = 64 * 1024


@dataclass(frozen=True)
class Listener:
    uid: int
    waiting: int  # connections in its accept queue, reset ones included
    receive_buffer: int  # bytes, what each waiting connection inherited


def _request(family: int) -> bytes:
    body = _REQUEST.pack(
        family, socket.IPPROTO_TCP, 1 << (_INET_DIAG_SKMEMINFO - 1), 1 << _TCP_LISTEN
    )
    flags = _NLM_F_REQUEST | _NLM_F_DUMP
    return _NLMSGHDR.pack(_NLMSGHDR.size + len(body), _SOCK_DIAG_BY_FAMILY, flags, 1, 0) + body


def parse(data: bytes, found: list[Listener]) -> bool:
    """Add the listeners in one read of a dump to ``found``; True once it is done."""
    offset = 0
    while offset + _NLMSGHDR.size <= len(data):
        length, kind, _, _, _ = _NLMSGHDR.unpack_from(data, offset)
        if length < _NLMSGHDR.size or offset + length > len(data):
            raise OSError(errno.EPROTO, "sock_diag: a malformed message")
        body = offset + _NLMSGHDR.size
        if kind == _NLMSG_DONE:
            return True
        if kind == _NLMSG_ERROR and length >= _NLMSGHDR.size + 4:
            (code,) = struct.unpack_from("=i", data, body)
            if code:  # 0 is an acknowledgement
                raise OSError(-code, f"sock_diag: {os.strerror(-code)}")
        elif kind == _SOCK_DIAG_BY_FAMILY and length >= _NLMSGHDR.size + _MESSAGE.size:
            *_, waiting, _, uid, _ = _MESSAGE.unpack_from(data, body)
            buffer = _receive_buffer(data, body + _MESSAGE.size, offset + length)
            found.append(Listener(uid, waiting, buffer))
        offset += (length + 3) & ~3
    return False


def _receive_buffer(data: bytes, at: int, end: int) -> int:
    while at + _ATTR.size <= end:
        length, kind = _ATTR.unpack_from(data, at)
        if length < _ATTR.size:
            break
        if kind == _INET_DIAG_SKMEMINFO and length >= _ATTR.size + 4 * (_SK_MEMINFO_RCVBUF + 1):
            (value,) = struct.unpack_from("=I", data, at + _ATTR.size + 4 * _SK_MEMINFO_RCVBUF)
            return int(value)
        at += (length + 3) & ~3
    return 0


def listeners(most: int) -> tuple[list[Listener], bool]:
    """The TCP listeners (IPv4 and IPv6) of the calling thread's network namespace, at
    most ``most`` of them, and whether that was all (the rest is not read). A kernel that
    does not answer within a second raises TimeoutError."""
    found: list[Listener] = []
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_SOCK_DIAG) as sock:
        sock.settimeout(1.0)
        for family in (socket.AF_INET, socket.AF_INET6):
            sock.sendto(_request(family), (0, 0))
            while not parse(sock.recv(_RECV_BYTES), found):
                if len(found) > most:
                    return found[:most], False
    return found[:most], len(found) <= most

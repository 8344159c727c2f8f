"""TCP and UDP sockets of the calling thread's network namespace, through sock_diag.

- ``listeners``: each TCP listener's owner's uid, how many connections wait in its
  accept queue (``idiag_rqueue`` of a listener), and its receive buffer, which each
  waiting connection inherits and may fill (``SK_MEMINFO_RCVBUF``). Used by tcpwatch.py,
  whose reason is in its docstring.
- ``end_sockets_of``: ends every TCP and UDP socket of a uid (``SOCK_DESTROY``),
  whoever holds it, orphans included. Used as a network job on L1/L2 ends
  (local_session.py says why).

sock_diag, not /proc/net/tcp: the table has no buffer sizes, and the kernel walks it
again from a bucket's start at each 4 KiB read (15,500 listeners on one port cost the
worker 200 ms a read, an attack review). Written out here, as loopback.py is: one
request a family, and a few fields of each answer.
"""

from __future__ import annotations

import errno
import os
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass

_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY, _SOCK_DESTROY = 20, 21
_NLM_F_REQUEST, _NLM_F_ACK, _NLM_F_DUMP = 0x1, 0x4, 0x300
_NLMSG_ERROR, _NLMSG_DONE = 2, 3
_TCP_LISTEN = 10
_ALL_STATES = 0xFFFFFFFF
_TCP_TIME_WAIT, _TCP_CLOSE, _TCP_NEW_SYN_RECV, _TCP_BOUND_INACTIVE = 6, 7, 12, 13
_NOT_ENDED_TCP = (
    1 << _TCP_TIME_WAIT | 1 << _TCP_CLOSE | 1 << _TCP_NEW_SYN_RECV | 1 << _TCP_BOUND_INACTIVE
)
# What end_sockets_of lists, by protocol (why: sockets_of). A UDP socket that is bound
# and not connected is in "close". Not UDP-Lite, which a job may make but the kernel
# cannot end (EOPNOTSUPP): like UDP it has no orphans, so it outlives the job's
# processes only where another holds it, and no other job can (landlock.py).
_ENDED_STATES = {
    socket.IPPROTO_TCP: _ALL_STATES & ~_NOT_ENDED_TCP,
    socket.IPPROTO_UDP: _ALL_STATES,
}
_INET_DIAG_SKMEMINFO = 7
_SK_MEMINFO_RCVBUF = 1
_NLMSGHDR = struct.Struct("=IHHII")  # length, type, flags, sequence, port
# inet_diag_req_v2: family, protocol, extensions, pad, states, socket id (48 bytes)
_REQUEST = struct.Struct("=BBBxI48s")
# inet_diag_msg: family, state, timer, retransmits, socket id (ports, addresses,
# interface, cookie: what names it to SOCK_DESTROY), expires, rqueue, wqueue, uid, inode
_MESSAGE = struct.Struct("=BBBB48sIIIII")
_ATTR = struct.Struct("=HH")  # length, type
_RECV_BYTES = 64 * 1024
_FAMILIES = (socket.AF_INET, socket.AF_INET6)
# Rounds of list-and-end: a socket is named by its addresses, so one of a reuseport
# group may be found as another of the group (ESTALE); the next round finds it again.
_END_ROUNDS = 4
# Sockets left sending are read again after 10 ms, then each pause twice the last up to
# 160 ms: a read is a dump of the host's TCP sockets (35 ms with 19,800 of them), which
# the worker pays (a review: 0.66 s of its CPU in one second of 10 ms reads).
_DRAIN_POLL_S, _DRAIN_POLL_MOST_S = 0.01, 0.16

Answer = Callable[[bytes, int, int], None]  # (data, body's offset, message's end)


@dataclass(frozen=True)
class Listener:
    uid: int
    waiting: int  # connections in its accept queue, reset ones included
    receive_buffer: int  # bytes, what each waiting connection inherited


@dataclass(frozen=True)
class Socket:
    family: int
    protocol: int
    ident: bytes  # inet_diag_sockid, as the kernel gave it
    sending: bool = False  # TCP, not listening, with data (or its FIN) not yet acked


def _request(kind: int, family: int, protocol: int, states: int, ext: int, ident: bytes) -> bytes:
    flags = _NLM_F_REQUEST | (_NLM_F_DUMP if kind == _SOCK_DIAG_BY_FAMILY else _NLM_F_ACK)
    body = _REQUEST.pack(family, protocol, ext, states, ident)
    return _NLMSGHDR.pack(_NLMSGHDR.size + len(body), kind, flags, 1, 0) + body


def walk(data: bytes, answer: Answer) -> bool:
    """Hand each socket's answer in one read to ``answer``; True once a dump is done.
    Other messages are skipped; an error raises; so does a message longer than what was
    read (it is malformed, not short)."""
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
            answer(data, body, offset + length)
        offset += (length + 3) & ~3
    return False


def parse(data: bytes, found: list[Listener]) -> bool:
    """Add the listeners in one read of a dump to ``found``; True once it is done."""

    def answer(data: bytes, body: int, end: int) -> None:
        *_, waiting, _, uid, _ = _MESSAGE.unpack_from(data, body)
        found.append(Listener(uid, waiting, _receive_buffer(data, body + _MESSAGE.size, end)))

    return walk(data, answer)


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


def _netlink() -> socket.socket:
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_SOCK_DIAG)
    sock.settimeout(1.0)  # a kernel that does not answer within a second: TimeoutError
    return sock


def listeners(most: int) -> tuple[list[Listener], bool]:
    """The TCP listeners (IPv4 and IPv6) of the calling thread's network namespace, at
    most ``most`` of them, and whether that was all (the rest is not read)."""
    found: list[Listener] = []
    ext = 1 << (_INET_DIAG_SKMEMINFO - 1)
    with _netlink() as sock:
        for family in _FAMILIES:
            request = _request(
                _SOCK_DIAG_BY_FAMILY, family, socket.IPPROTO_TCP, 1 << _TCP_LISTEN, ext, bytes(48)
            )
            sock.sendto(request, (0, 0))
            while not parse(sock.recv(_RECV_BYTES), found):
                if len(found) > most:
                    return found[:most], False
    return found[:most], len(found) <= most


def sockets_of(uid: int) -> list[Socket]:
    """Every TCP and UDP socket (IPv4 and IPv6) of the calling thread's namespace whose
    owner is ``uid``: the uid it was made with, which a socket keeps wherever it is
    passed, and once closed while it still sends (an orphan). Not TCP's time-wait ones
    and half-open requests (no uid, nothing held: a job made 125,000 time-wait ones,
    which took each dump 0.16 s, a review), nor its closed or only bound ones (no
    buffers; the kernel ends none of them, so one still held would never go)."""
    with _netlink() as sock:
        return _sockets_of(sock, uid)


def _sockets_of(sock: socket.socket, uid: int) -> list[Socket]:
    found: list[Socket] = []
    for protocol, states in _ENDED_STATES.items():

        def answer(data: bytes, body: int, _end: int, protocol: int = protocol) -> None:
            family, state, _, _, ident, _, _, unacked, owner, _ = _MESSAGE.unpack_from(data, body)
            if owner == uid:
                # a listener's wqueue is its backlog; UDP's, data it sends at once
                sending = protocol == socket.IPPROTO_TCP and state != _TCP_LISTEN and unacked > 0
                found.append(Socket(family, protocol, ident, sending))

        for family in _FAMILIES:
            request = _request(_SOCK_DIAG_BY_FAMILY, family, protocol, states, 0, bytes(48))
            sock.sendto(request, (0, 0))
            while not walk(sock.recv(_RECV_BYTES), answer):
                pass
    return found


def _end(sock: socket.socket, one: Socket) -> None:
    """End ``one`` as the kernel's tcp_abort/udp_abort does: a reset to its peer, its
    buffers freed. OSError ENOENT once it is gone; ESTALE if its addresses now name
    another socket."""
    sock.sendto(
        _request(_SOCK_DESTROY, one.family, one.protocol, _ALL_STATES, 0, one.ident), (0, 0)
    )
    walk(sock.recv(_RECV_BYTES), lambda *_: None)


def end_sockets_of(uid: int, drain_until: float = 0.0) -> int:
    """End every TCP and UDP socket of ``uid`` in the calling thread's namespace; how
    many were ended. Until ``drain_until`` (``time.monotonic``), while some TCP socket
    still sends, they are left to it (its peer gets what was sent). OSError where the
    kernel cannot (no ``CONFIG_INET_DIAG_DESTROY``: EOPNOTSUPP), or some outlive every
    round."""
    ended = 0
    round_ = 0
    pause = _DRAIN_POLL_S
    with _netlink() as sock:  # one for every dump and every end
        while True:
            left = _sockets_of(sock, uid)
            if not left:
                return ended
            if any(one.sending for one in left) and time.monotonic() < drain_until:
                time.sleep(pause)
                pause = min(2 * pause, _DRAIN_POLL_MOST_S)  # each read is a whole dump
                continue
            if round_ == _END_ROUNDS:
                break
            round_ += 1
            for one in left:
                try:
                    _end(sock, one)
                    ended += 1
                except OSError as exc:
                    if exc.errno not in (errno.ENOENT, errno.ESTALE):
                        raise
    raise OSError(errno.EBUSY, f"{len(left)} sockets of uid {uid} outlived {_END_ROUNDS} rounds")

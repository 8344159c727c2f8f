"""A job's loopback: up, with packets of at most ``defaults.LOOPBACK_PACKET_BYTES``.

Why small packets: the kernel lets each TCP socket queue about one packet past its
cgroup's TCP limit (a forced charge), so a job holding many connections passes its
bound by a packet a socket: ~64 KiB at loopback's usual MTU and GSO size, ~1 GiB of the
host's one ``tcp_mem`` pool at the default limits' 16,384 sockets. Measured here with
4,000 sockets: 65 KB a socket at 64 KiB packets, 64 KB at 32 KiB, 34 KB at 16 KiB,
18 KB at 8 KiB (SECURITY.md, "TCP socket buffers"). Both sizes must shrink: the MTU
alone or the GSO size alone left it where it was.

Set by one rtnetlink message (RTM_NEWLINK on ``lo``: up, MTU, GSO size) from a thread
in the namespace (childsetup.new_network_namespace; a container's:
containers.configure_container_loopback). Written out here rather than through
pyroute2: it runs once a session on the job's critical path, and three attributes are
the whole of it.
"""

from __future__ import annotations

import errno
import os
import socket
import struct

from sandbox_core.defaults import LOOPBACK_PACKET_BYTES

_RTM_NEWLINK = 16
_NLM_F_REQUEST, _NLM_F_ACK = 0x1, 0x4
_NLMSG_ERROR = 2
_IFF_UP = 0x1
_IFLA_MTU, _IFLA_GSO_MAX_SIZE = 4, 41
_NLMSGHDR = struct.Struct("=IHHII")  # length, type, flags, sequence, port
_IFINFOMSG = struct.Struct("=BxHiII")  # family, type, index, flags, change
_U32_ATTR = struct.Struct("=HHI")  # length, type, value


def _setlink_message(index: int, packet_bytes: int) -> bytes:
    body = _IFINFOMSG.pack(socket.AF_UNSPEC, 0, index, _IFF_UP, _IFF_UP)
    body += _U32_ATTR.pack(_U32_ATTR.size, _IFLA_MTU, packet_bytes)
    body += _U32_ATTR.pack(_U32_ATTR.size, _IFLA_GSO_MAX_SIZE, packet_bytes)
    flags = _NLM_F_REQUEST | _NLM_F_ACK
    return _NLMSGHDR.pack(_NLMSGHDR.size + len(body), _RTM_NEWLINK, flags, 1, 0) + body


def configure_loopback(packet_bytes: int = LOOPBACK_PACKET_BYTES) -> None:
    """Bring up ``lo`` of the calling thread's network namespace with ``packet_bytes``
    as its MTU and GSO size (needs CAP_NET_ADMIN there; raises OSError otherwise)."""
    index = socket.if_nametoindex("lo")
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE) as sock:
        sock.sendto(_setlink_message(index, packet_bytes), (0, 0))
        reply = sock.recv(4096)
    _, kind, _, _, _ = _NLMSGHDR.unpack_from(reply)
    if kind != _NLMSG_ERROR:  # an acknowledgement is an error message of code 0
        raise OSError(errno.EPROTO, f"rtnetlink: unexpected reply to RTM_NEWLINK: {kind}")
    (code,) = struct.unpack_from("=i", reply, _NLMSGHDR.size)
    if code:
        raise OSError(-code, f"rtnetlink: setting lo's packet size: {os.strerror(-code)}")

"""What a client that holds no key can make a gateway hold: a real `sandfarm gateway` and
raw sockets on loopback (an attack review, stop 39: headers and non-API bodies were
buffered without a bound, and idle connections were kept for ever, until the process
ran out of descriptors). producer/gateway/protocol.py, app.py BodyLimit."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit

import httpx
import pytest

from tests.farmkit import Farm, farm_db, make_farm, wait_for  # noqa: F401
from tests.gatewaykit import Gateway, launch_gateway

pytestmark = pytest.mark.timeout(120)


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def _server_pid(gateway: Gateway) -> int:
    return gateway.proc.pid  # `sandfarm gateway` serves in its own process (workers 1)


@contextmanager
def _gateway(make_farm, **env: str) -> Iterator[Gateway]:  # noqa: F811
    farm: Farm = make_farm(**env)
    from tests.farmkit import free_port

    gateway = launch_gateway(farm, "127.0.0.1", free_port())
    try:
        yield gateway
    finally:
        gateway.stop()


def _connect(gateway: Gateway, source: str = "127.0.0.1") -> socket.socket:
    parts = urlsplit(gateway.url)
    sock = socket.socket()
    sock.bind((source, 0))
    sock.connect((parts.hostname, parts.port))
    return sock


def _closed_within(sock: socket.socket, seconds: float) -> bool:
    sock.settimeout(seconds)
    try:
        while sock.recv(65536):
            pass  # an error answer, then the close
        return True
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def _push(sock: socket.socket, data: bytes, total: int, seconds: float) -> int:
    """Send ``data`` over and over, up to ``total`` bytes, for at most ``seconds``;
    returns what the gateway's side took (its reads and the kernel's buffers)."""
    sock.settimeout(0.5)
    sent, deadline = 0, time.monotonic() + seconds
    while sent < total and time.monotonic() < deadline:
        try:
            sent += sock.send(data)
        except TimeoutError:
            continue  # its buffers are full: it stopped reading
        except (BrokenPipeError, ConnectionResetError):
            break  # it closed the connection
    return sent


def test_a_keyless_client_cannot_make_the_gateway_hold_its_headers_or_bodies(make_farm) -> None:  # noqa: F811
    with _gateway(make_farm) as gateway:
        pid = _server_pid(gateway)
        before = _rss_mb(pid)
        # 64 MiB of one header: refused after h11's 16 KiB (httptools took all of it)
        head = _connect(gateway)
        head.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: ")
        taken = _push(head, b"a" * 65536, 64 << 20, 10)
        assert taken < 16 << 20, taken  # it stopped taking them
        assert _closed_within(head, 5)
        # keyless bodies to a path outside the API, sent whole while the connections stay
        # open: answered and dropped as they come (BodyLimit buffered up to 16 MiB each)
        bodies = []
        for _ in range(5):
            sock = _connect(gateway)
            sock.sendall(b"POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 16000000\r\n\r\n")
            bodies.append((sock, _push(sock, b"b" * 65536, 15_000_000, 3)))
        assert sum(took for _, took in bodies) > 50_000_000  # 75 MB went out
        grown = _rss_mb(pid) - before
        assert grown < 30, f"the gateway grew {grown:.0f} MB"
        for sock, _ in bodies:
            sock.close()
        head.close()
        assert httpx.get(f"{gateway.url}/healthz", timeout=5).status_code == 200


def test_idle_connections_are_closed_and_bounded_per_client(make_farm) -> None:  # noqa: F811
    env = {
        "SANDFARM_GATEWAY_HEADER_TIMEOUT_S": "1",
        "SANDFARM_GATEWAY_MAX_CONNECTIONS_PER_CLIENT": "20",
    }
    with _gateway(make_farm, **env) as gateway:
        # half a request line, never finished: open a moment, closed after the timeout
        slow = _connect(gateway)
        slow.sendall(b"GET /heal")
        assert not _closed_within(slow, 0.5)  # the attack holds it: it is still open
        assert _closed_within(slow, 3)
        slow.close()
        # one address holds 20 at most; the 21st is closed at once, another address is
        # still served
        held = [_connect(gateway) for _ in range(20)]
        for sock in held:
            sock.sendall(b"GET /heal")
        extra = _connect(gateway)
        assert _closed_within(extra, 0.5)
        other = _connect(gateway, source="127.0.0.2")
        other.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        other.settimeout(5)
        assert other.recv(100).startswith(b"HTTP/1.1 200"), "another address is refused"
        for sock in [*held, extra, other]:
            sock.close()
        # once they are gone, the address is served again
        wait_for(
            lambda: httpx.get(f"{gateway.url}/healthz", timeout=2).status_code == 200,
            10,
            0.2,
            "served again",
        )


def test_no_connection_is_upgraded_or_logged_for_trying(make_farm) -> None:  # noqa: F811
    """An upgraded connection left the per-client count for good (a review: with the
    `websockets` package installed, 256 upgrades locked their address out), and each
    refused one logged two warnings. No request is upgraded: it is served as HTTP."""
    with _gateway(make_farm) as gateway:
        for _ in range(3):
            sock = _connect(gateway)
            sock.sendall(
                b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\n"
                b"Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
                b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
            )
            sock.settimeout(5)
            assert sock.recv(100).startswith(b"HTTP/1.1 200"), "not served as HTTP"
            sock.close()
        assert "upgrade" not in gateway.log.read_text().lower()


def test_a_keyed_body_that_trickles_ends_with_408(make_farm) -> None:  # noqa: F811
    """A tenant's request whose body trickled, or was promised and never sent, held its
    slot and connection with no end (a review). It has the body timeout, then 408."""
    from producer.protocol import connect
    from producer.protocol.tenant_store import TenantStore
    from producer.protocol.tenants import Policy

    farm: Farm = make_farm(SANDFARM_GATEWAY_BODY_TIMEOUT_S="2")
    from tests.farmkit import free_port

    gateway = launch_gateway(farm, "127.0.0.1", free_port())
    try:
        store = TenantStore(connect(farm.settings.redis_url), farm.settings.keys)
        store.add("slow", Policy())
        key, _ = store.create_key("slow")
        sock = _connect(gateway)
        head = (
            "POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {key}\r\nContent-Length: 1000\r\n\r\n"
        )
        sock.sendall(head.encode() + b'{"jobs": [')
        started = time.monotonic()
        sock.settimeout(0.5)
        answer = b""
        while time.monotonic() - started < 10 and not answer:
            with contextlib.suppress(TimeoutError):
                sock.sendall(b" ")  # a byte a half second: never the whole body
                answer = sock.recv(200)
        assert answer.startswith(b"HTTP/1.1 408"), answer
        assert 1.5 < time.monotonic() - started < 6
        sock.close()
    finally:
        gateway.stop()

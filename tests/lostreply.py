"""A loopback TCP proxy in front of Redis that loses one answer, or holds it back: once
armed, it forwards the next command that holds a marker (say ``EVALSHA``, or a script's
sha), lets Redis run it, then drops Redis's answer and closes the client's connection,
as a network that failed at that moment would (the client's retry comes back through
the proxy, which forwards it); or delivers that answer only ``delay_s`` later."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit


class LostReply:
    def __init__(self, redis_url: str, marker: bytes) -> None:
        parts = urlsplit(redis_url)
        self._target = (parts.hostname or "127.0.0.1", parts.port or 6379)
        self._marker = marker
        self._listener = socket.create_server(("127.0.0.1", 0))
        port = self._listener.getsockname()[1]
        self.url = urlunsplit((parts.scheme, f"127.0.0.1:{port}", parts.path, "", ""))
        self._lock = threading.Lock()
        self._armed = False
        self._delay_s: float | None = None
        self.forwarded = 0  # commands with the marker that reached Redis
        self.intercepted = 0  # answers lost or held back
        threading.Thread(target=self._accept, daemon=True).start()

    def arm(self, delay_s: float | None = None) -> None:
        """Lose the answer to the next command that holds the marker (or, with
        ``delay_s``, deliver it that much later)."""
        with self._lock:
            self._armed = True
            self._delay_s = delay_s

    def close(self) -> None:
        self._listener.close()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                client, _ = self._listener.accept()
                server = socket.create_connection(self._target)
                lose = threading.Event()  # set: the next answer is the marked one
                for pump, ends in ((self._up, (client, server)), (self._down, (server, client))):
                    threading.Thread(target=pump, args=(*ends, lose), daemon=True).start()

    def _up(self, client: socket.socket, server: socket.socket, lose: threading.Event) -> None:
        with contextlib.suppress(OSError):
            while data := client.recv(65536):
                if self._marker in data:
                    with self._lock:
                        self.forwarded += 1
                        if self._armed:
                            self._armed = False
                            lose.set()
                server.sendall(data)
        _shut(server)

    def _down(self, server: socket.socket, client: socket.socket, lose: threading.Event) -> None:
        with contextlib.suppress(OSError):
            while data := server.recv(65536):
                if lose.is_set():  # Redis ran the command: its answer is lost, or late
                    lose.clear()
                    with self._lock:
                        self.intercepted += 1
                        delay_s = self._delay_s
                    if delay_s is None:
                        break
                    time.sleep(delay_s)
                client.sendall(data)
        _shut(client)
        _shut(server)


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


@contextlib.contextmanager
def lost_reply(redis_url: str, marker: bytes = b"EVALSHA") -> Iterator[LostReply]:
    proxy = LostReply(redis_url, marker)
    try:
        yield proxy
    finally:
        proxy.close()

"""The collector's HTTP server: a thread per connection, as few as a scraper needs. A
scrape comes every few seconds; anything slower or more numerous is not Prometheus.

Each connection held a thread for ever, before its token was ever checked: 2,000 idle
ones from anyone who could connect made 2,001 threads (an attack review, stop 39); a
second review then kept the 32 slots of the first fix full with one byte every 5 s a
connection, and no scrape got through. So a request's head must be in within
REQUEST_TIMEOUT_S of its connection, whatever trickles meanwhile; and with every slot
taken, a new connection evicts the oldest one whose head has not come.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from http.server import ThreadingHTTPServer
from typing import Any

REQUEST_TIMEOUT_S = 10.0
MAX_CONNECTIONS = 32
EVICT_WAIT_S = 1.0  # for the evicted connection's thread to give its slot back
MIN_AGE_S = 2.0  # a connection this young is not evicted: a flood must not evict a scrape


class BoundedServer(ThreadingHTTPServer):
    request_queue_size = 64  # the listen backlog: 5 made a burst of connects wait 1 s each

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._lock = threading.Lock()
        self._waiting: dict[Any, float] = {}  # connections whose head has not come, since
        threading.Thread(target=self._sweep, name="metrics-heads", daemon=True).start()

    def head_in(self, request: Any) -> None:
        """The handler read ``request``'s head: it is no longer waited on."""
        with self._lock:
            self._waiting.pop(request, None)

    def process_request(self, request: Any, client_address: Any) -> None:
        # full: evict the oldest waiting for its head, or refuse at once (waiting here
        # stalls every accept)
        if not self._slots.acquire(blocking=False) and (
            not self._evict(oldest=True) or not self._slots.acquire(timeout=EVICT_WAIT_S)
        ):
            self.shutdown_request(request)
            return
        with self._lock:
            self._waiting[request] = time.monotonic()
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._release(request)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._release(request)

    def _release(self, request: Any) -> None:
        with self._lock:
            self._waiting.pop(request, None)
        self._slots.release()

    def _evict(self, oldest: bool = False) -> bool:
        """End the oldest connection still without its head (``oldest``; none younger
        than MIN_AGE_S), or every one past REQUEST_TIMEOUT_S. Whether one was ended."""
        with self._lock:
            now = time.monotonic()
            late = [r for r, since in self._waiting.items() if now - since > REQUEST_TIMEOUT_S]
            if oldest and not late and self._waiting:  # never one just come (a scrape)
                first = min(self._waiting, key=self._waiting.__getitem__)
                late = [first] if now - self._waiting[first] > MIN_AGE_S else []
            for request in late:
                del self._waiting[request]
        for request in late:
            with contextlib.suppress(OSError):
                request.shutdown(socket.SHUT_RDWR)  # its thread ends, and gives its slot back
        return bool(late)

    def _sweep(self) -> None:
        while True:
            time.sleep(1.0)
            self._evict()

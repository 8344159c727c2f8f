"""The gateway's HTTP/1.1 connections: uvicorn's h11 protocol with what a server facing
untrusted clients needs and uvicorn leaves out (an attack review, stop 39).

- Headers are bounded: h11 refuses a request whose line and headers pass
  ``MAX_HEAD_BYTES``. uvicorn's default parser, httptools, buffers them without a bound:
  300 MiB of headers to /healthz, with no key, grew a gateway by 250 MB.
- A request's line and headers must come within ``gateway_header_timeout_s`` of the
  connection's start (or of its last response): uvicorn starts no timer before a first
  request, so connections sending half a request line stayed open for ever.
- A process holds at most ``gateway_max_connections`` connections, and at most
  ``gateway_max_connections_per_client`` from one address; more are closed as they come.
  20,000 idle ones used up its descriptors, and a tenant's request failed.

- No connection is upgraded (WebSocket, h2c): the API has none, and an upgraded
  connection would leave the per-client count behind.

A flood from many addresses can still fill the connection bound, denying service until
the header timeout frees it: a firewall or proxy in front is the answer to that
(SECURITY.md).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from functools import cache
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

from producer.protocol import Settings, get_settings

MAX_HEAD_BYTES = 16 * 1024  # h11's incomplete-event bound: a request line and its headers

_per_client: Counter[str] = Counter()  # this process's open connections by address


@cache
def _settings() -> Settings:
    return get_settings()


class GatewayProtocol(H11Protocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._address: str | None = None  # counted in _per_client while open
        self._head_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        settings = _settings()
        address = self.client[0] if self.client else ""
        over_all = len(self.connections) > settings.gateway_max_connections
        if over_all or _per_client[address] >= settings.gateway_max_connections_per_client:
            transport.close()
            return
        self._address = address
        _per_client[address] += 1
        self._await_head()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None
        if self._address is not None:
            _per_client[self._address] -= 1
            if _per_client[self._address] <= 0:
                del _per_client[self._address]
            self._address = None
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._await_head()  # the next request's head, if any comes

    def _should_upgrade(self) -> bool:
        # No upgrade, ever: the API has no WebSocket route, an upgraded connection left
        # the per-client count for good (a review: an address locked out, with the
        # `websockets` package installed), and each refused one logged two warnings.
        return False

    def _await_head(self) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
        timeout = _settings().gateway_header_timeout_s
        self._head_deadline = self.loop.call_later(timeout, self._head_late)

    def _head_late(self) -> None:
        """No request began since the timer was armed (or the last one has ended)."""
        self._head_deadline = None
        if self.cycle is None or self.cycle.response_complete:
            self.transport.close()

"""The ASGI types the gateway's own middleware speaks, and an empty request body."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]


async def no_body() -> MutableMapping[str, Any]:
    """What a response sent without reading the request's body is given to receive."""
    return {"type": "http.request", "body": b"", "more_body": False}

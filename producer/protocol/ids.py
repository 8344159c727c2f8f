"""Random version-4 UUIDs, written from os.urandom: the uuid module's object costs ~4 µs
each, and every submitted job takes two (its id, its message's delivery tag). And the
names a client gives its completion list, checked alike for both SDKs and the gateway."""

from __future__ import annotations

import os
import re

from sandbox_core.errors import SpecError

# A client's name ends a Redis key ("done:<client>" for the trusted SDK, "done:<tenant>:
# <client>" at the gateway): no ":" keeps the two apart, no space or newline keeps it one
# header and one log word. "." and "@" are allowed: a host name or user@host is a natural
# stable name, and neither is special in a key, a header or a SCAN pattern.
CLIENT_ID_RE = re.compile(r"[A-Za-z0-9._@-]{1,64}")
CLIENT_ID_RULE = "1-64 of [A-Za-z0-9._@-]"


def _random_v4() -> str:
    raw = bytearray(os.urandom(16))
    raw[6] = raw[6] & 0x0F | 0x40  # version 4
    raw[8] = raw[8] & 0x3F | 0x80  # the RFC 4122 variant
    return raw.hex()


def random_hex_id() -> str:
    """``uuid.uuid4().hex``: 32 hex digits."""
    return _random_v4()


def random_uuid() -> str:
    """``str(uuid.uuid4())``: 8-4-4-4-12 hex digits."""
    h = _random_v4()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def client_id(name: str | None) -> str:
    """``name`` as a client's name for its completion list, or a new random one (None or
    empty, as before names were checked). Raises SpecError (field ``client_id``) for
    anything but 1-64 of [A-Za-z0-9._@-]."""
    if name is None or name == "":
        return random_hex_id()
    if not isinstance(name, str) or not CLIENT_ID_RE.fullmatch(name):
        raise SpecError(
            "client_id", f"must be {CLIENT_ID_RULE} (it names this client's completion list)", name
        )
    return name

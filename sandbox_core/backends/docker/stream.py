"""Docker's multiplexed exec stream: 8-byte frame headers (stream id, 3 pad bytes, big-
endian length) before each chunk of stdout (1) or stderr (2)."""

from __future__ import annotations

import struct

STDOUT, STDERR = 1, 2
_HEADER = 8


class FrameDemux:
    """Feed raw bytes in any cut; get the whole frames out as (stream id, payload)."""

    def __init__(self) -> None:
        self._pending = bytearray()

    @property
    def pending(self) -> int:
        """Bytes received of a frame not yet whole."""
        return len(self._pending)

    def feed(self, chunk: bytes) -> list[tuple[int, bytes]]:
        self._pending += chunk
        frames: list[tuple[int, bytes]] = []
        offset, pending = 0, self._pending
        while len(pending) - offset >= _HEADER:
            (size,) = struct.unpack_from(">I", pending, offset + 4)
            end = offset + _HEADER + size
            if len(pending) < end:
                break
            frames.append((pending[offset], bytes(pending[offset + _HEADER : end])))
            offset = end
        del pending[:offset]
        return frames

"""Head + tail bounded capture of a byte stream, in O(budget) memory."""

from __future__ import annotations

REPLACEMENT = "\ufffd"


def _utf8_length(lead: int) -> int:
    """Bytes a UTF-8 sequence starting with ``lead`` should have (1 for invalid leads)."""
    if lead < 0x80:
        return 1
    if lead >> 5 == 0b110:
        return 2
    if lead >> 4 == 0b1110:
        return 3
    if lead >> 3 == 0b11110:
        return 4
    return 1


def _complete_prefix_length(data: bytes) -> int:
    """Length of ``data`` without a trailing, incomplete UTF-8 sequence."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 == 0x80:  # continuation byte: keep looking for the lead
            continue
        return len(data) - back if _utf8_length(byte) > back else len(data)
    return len(data)


def _leading_continuations(data: bytes) -> int:
    """How many continuation bytes (at most 3) open ``data``: the rest of a cut character."""
    count = 0
    while count < min(3, len(data)) and data[count] & 0xC0 == 0x80:
        count += 1
    return count


class HeadTailBuffer:
    """Keeps the first ``head`` and the last ``tail`` bytes of a stream and counts the rest.

    Memory is bounded by head + 2 * tail bytes whatever is written.
    """

    def __init__(self, budget: int, head_ratio: float = 0.5) -> None:
        self.head_limit = int(budget * head_ratio)
        self.tail_limit = budget - self.head_limit
        self._head = bytearray()
        self._tail = bytearray()
        self.total = 0

    def write(self, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(data)
        self.total += len(view)
        room = self.head_limit - len(self._head)
        if room > 0:
            self._head += view[:room]
            view = view[room:]
        if not len(view) or not self.tail_limit:
            return
        if len(view) >= self.tail_limit:
            self._tail[:] = view[-self.tail_limit :]
        else:
            self._tail += view
            if len(self._tail) > 2 * self.tail_limit:  # amortised trim
                del self._tail[: -self.tail_limit]

    @property
    def head(self) -> bytes:
        return bytes(self._head)

    @property
    def tail(self) -> bytes:
        return bytes(self._tail[-self.tail_limit :]) if self.tail_limit else b""

    def last(self, count: int) -> bytes:
        """The last ``count`` kept bytes (from the tail, or the head if nothing was cut)."""
        kept = self.tail if self.truncated else self.head + self.tail
        return kept[-count:]

    @property
    def omitted(self) -> int:
        return self.total - len(self._head) - len(self.tail)

    @property
    def truncated(self) -> bool:
        return self.omitted > 0

    def text(self) -> str:
        """The kept bytes as text: invalid UTF-8 replaced, at most one U+FFFD at each cut."""
        head, tail = self.head, self.tail
        if not self.truncated:
            return (head + tail).decode("utf-8", "replace")
        keep = _complete_prefix_length(head)
        head_text = head[:keep].decode("utf-8", "replace") + (
            REPLACEMENT if keep < len(head) else ""
        )
        skip = _leading_continuations(tail)
        tail_text = (REPLACEMENT if skip else "") + tail[skip:].decode("utf-8", "replace")
        return f"{head_text}\n[... {self.omitted} bytes omitted ...]\n{tail_text}"

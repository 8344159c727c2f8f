"""Head + tail bounded capture of a byte stream, in O(budget) memory, and its text
bounded as it will be serialised: a control byte costs 6 bytes of JSON (``\\u00XX``), so
a budget of raw bytes alone would let a result grow sixfold."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

REPLACEMENT = "\ufffd"


def json_size(text: str) -> int:
    """Bytes ``text`` takes inside a JSON document (pydantic escapes as json.dumps does)."""
    return len(json.dumps(text, ensure_ascii=False).encode()) - 2


def _longest(fits: Callable[[int], bool], upper: int) -> int:
    """The largest n in 0..upper with fits(n) (fits is monotone: true, then false)."""
    low, high = 0, upper
    while low < high:
        middle = (low + high + 1) // 2
        if fits(middle):
            low = middle
        else:
            high = middle - 1
    return low


def _head_size(data: bytes) -> int:
    """What a head of ``data`` serialises to (a cut character becomes one U+FFFD)."""
    return json_size(data[: _complete_prefix_length(data)].decode("utf-8", "replace"))


def _tail_size(data: bytes) -> int:
    """What a tail of ``data`` serialises to (a cut character becomes one U+FFFD)."""
    return json_size(data[_leading_continuations(data) :].decode("utf-8", "replace"))


def fit_prefix(data: bytes, budget: int) -> bytes:
    """The longest prefix of ``data`` whose text serialises in ``budget`` bytes."""
    if _head_size(data) <= budget:
        return data
    return data[: _longest(lambda n: _head_size(data[:n]) <= budget, min(len(data), budget))]


def fit_suffix(data: bytes, budget: int) -> bytes:
    """The longest suffix of ``data`` whose text serialises in ``budget`` bytes."""
    if _tail_size(data) <= budget:
        return data
    size = len(data)
    keep = _longest(lambda n: _tail_size(data[size - n :]) <= budget, min(size, budget))
    return data[size - keep :] if keep else b""


@dataclass(frozen=True)
class Rendered:
    """A stream's kept text, and whether anything of the stream is missing from it."""

    text: str
    truncated: bool


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

    def skip(self, count: int) -> None:
        """Count ``count`` bytes that were not read, after a full head: what the tail held
        is no longer the last of the stream."""
        if count > 0:
            self.total += count
            self._tail.clear()

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
        return self.render().text

    def render(self) -> Rendered:
        """The kept bytes as text that serialises within the budget (head and tail each
        within their share); invalid UTF-8 replaced, at most one U+FFFD at each cut."""
        head, tail = self.head, self.tail
        if not self.truncated:
            whole = head + tail
            text = whole.decode("utf-8", "replace")
            if json_size(text) <= self.head_limit + self.tail_limit:
                return Rendered(text, False)
            head = fit_prefix(whole[: self.head_limit], self.head_limit)
            tail = fit_suffix(whole[self.head_limit :], self.tail_limit)
        else:
            head = fit_prefix(head, self.head_limit)
            tail = fit_suffix(tail, self.tail_limit)
        omitted = self.total - len(head) - len(tail)
        return Rendered(_cut_text(head, tail, omitted), True)


def _cut_text(head: bytes, tail: bytes, omitted: int) -> str:
    """Head and tail around the omission marker, cut cleanly at character boundaries."""
    keep = _complete_prefix_length(head)
    head_text = head[:keep].decode("utf-8", "replace") + (REPLACEMENT if keep < len(head) else "")
    skip = _leading_continuations(tail)
    tail_text = (REPLACEMENT if skip else "") + tail[skip:].decode("utf-8", "replace")
    return f"{head_text}\n[... {omitted} bytes omitted ...]\n{tail_text}"

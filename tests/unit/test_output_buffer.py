"""HeadTailBuffer against the reference: head + tail of the full stream."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sandbox_core.output import REPLACEMENT, HeadTailBuffer, json_size


def _feed(chunks: list[bytes], budget: int, ratio: float = 0.5) -> HeadTailBuffer:
    buffer = HeadTailBuffer(budget, ratio)
    for chunk in chunks:
        buffer.write(chunk)
    return buffer


@settings(max_examples=300)
@given(
    chunks=st.lists(st.binary(max_size=300), max_size=30),
    budget=st.integers(min_value=0, max_value=600),
    ratio=st.floats(min_value=0, max_value=1),
)
def test_matches_head_plus_tail_of_full_stream(chunks, budget, ratio):
    full = b"".join(chunks)
    buffer = _feed(chunks, budget, ratio)
    head_n = int(budget * ratio)
    tail_n = budget - head_n
    assert buffer.total == len(full)
    if len(full) <= budget:
        assert buffer.head + buffer.tail == full
        assert buffer.omitted == 0 and not buffer.truncated
    else:
        assert buffer.head == full[:head_n]
        assert buffer.tail == (full[-tail_n:] if tail_n else b"")
        assert buffer.omitted == len(full) - budget
    assert len(buffer._head) + len(buffer._tail) <= head_n + 2 * tail_n  # O(budget) memory


@settings(max_examples=300)
@given(
    text=st.text(max_size=400),
    cuts=st.lists(st.integers(min_value=0, max_value=2000), max_size=8),
    budget=st.integers(min_value=1, max_value=200),
)
def test_valid_utf8_gets_at_most_one_replacement_per_cut(text, cuts, budget):
    data = text.encode()
    chunks, last = [], 0
    for cut in sorted(c % (len(data) + 1) for c in cuts):
        chunks.append(data[last:cut])
        last = cut
    chunks.append(data[last:])
    rendered = _feed(chunks, budget, 0.5).text()
    original_replacements = text.count(REPLACEMENT)
    assert rendered.count(REPLACEMENT) <= original_replacements + 2
    if json_size(text) <= budget:  # the budget counts bytes as they serialise
        assert rendered == text


def test_reports_omitted_and_marks_the_cut():
    buffer = _feed([b"a" * 100, b"b" * 100], 20, 0.5)
    assert buffer.text() == "a" * 10 + "\n[... 180 bytes omitted ...]\n" + "b" * 10
    assert buffer.truncated


def test_cut_inside_a_multibyte_character():
    euro = "€".encode()  # 3 bytes
    buffer = _feed([euro * 10], 8, 0.5)  # head: 4 bytes = 1 char + 1 byte
    head, _, tail = buffer.text().partition("\n[...")
    assert head == "€" + REPLACEMENT
    assert tail.endswith("€")
    assert tail.split("]\n", 1)[1].count(REPLACEMENT) <= 1


def test_invalid_bytes_become_replacements():
    assert _feed([b"ok\xff"], 100).text() == "ok" + REPLACEMENT


def test_last_bytes_come_from_head_when_not_truncated():
    assert _feed([b"MemoryError\n"], 1000).last(6) == b"Error\n"

"""What the CLI prints of what a job or a spec holds (output, messages, labels, ids,
paths): a job must not move the cursor, erase lines, retitle the window or print a row
that passes for the farm's own. So:

- control, format (bidi overrides, zero-width), separator and unassigned characters are
  shown escaped (``\\x1b``, ``\\u202e``): an attack review (stop 39) retitled the window
  and cleared the screen from `batch run`'s table with a label, and a second one printed
  rows through U+2028;
- on a terminal, whatever the CLI prints of a job is cut into rows here, each starting
  with the CLI's indent, counting every character at least as wide as any terminal draws
  it (rich counts some as 0 that terminals draw 1 or 2 wide: a row of them wrapped past
  the indent and printed `=== succeeded` at column 0, the second review);
- rich never reads markup in such text (``plain``).
"""

from __future__ import annotations

import os
import unicodedata
from typing import IO

from rich.cells import cell_len
from rich.text import Text

_ESCAPED_CATEGORIES = {"Cc", "Cf", "Zl", "Zp", "Cs", "Cn"}
_KEPT = {"\n", "\t"}  # where text keeps its lines
OUTPUT_PREFIX = "  | "
MESSAGE_PREFIX = "    "
MAX_TABBED_LINE = 4096


def _escaped(char: str) -> str:
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


_ASCII = [*range(0x20), 0x7F]
_ASCII_LINES = {c: _escaped(chr(c)) for c in _ASCII if chr(c) not in _KEPT}
_ASCII_ONE_LINE = {c: _escaped(chr(c)) for c in _ASCII}


def _safe(text: str, keep_lines: bool) -> str:
    if text.isascii():  # the common case, at C speed: C0 controls and DEL
        return text.translate(_ASCII_LINES if keep_lines else _ASCII_ONE_LINE)
    keep = _KEPT if keep_lines else set()
    return "".join(
        c if c in keep or unicodedata.category(c) not in _ESCAPED_CATEGORIES else _escaped(c)
        for c in text
    )


def one_line(text: str) -> str:
    """One line whatever ``text`` holds: every control, format and separator character
    escaped, newlines too (what a message, a label or a field name is printed as)."""
    return _safe(text, keep_lines=False)


def plain(text: str) -> Text:
    """``text`` for rich as itself: one line, no markup read in it, and no character
    rich counts narrower than terminals draw it (rich lays it out by its own count: a
    row of Hangul fillers, 0 columns to rich and 2 to glibc, pushed a label's words to
    the start of a row, a review)."""
    return Text(_rich_safe(one_line(text)))


def _rich_safe(text: str) -> str:
    if text.isascii():
        return text
    return "".join(_escaped(c) if _rich_narrower(c) else c for c in text)


def _rich_narrower(char: str) -> bool:
    if char.isascii() or unicodedata.category(char) in ("Mn", "Me"):
        return False
    drawn = 2 if unicodedata.east_asian_width(char) in ("W", "F") else 1
    if 0x4DC0 <= ord(char) <= 0x4DFF:  # glibc draws the Yijing hexagrams 2 wide
        drawn = 2
    return cell_len(char) < drawn


def _width(char: str) -> int:
    """At least the columns any terminal gives ``char`` (never less: a row cut too short
    is only untidy, one cut too long wraps past its indent). Width tables differ between
    Python's, glibc's and terminals' own (a review found U+4DC0-4DFF 1 wide in Python's,
    2 in glibc's), so every character but ASCII and combining marks counts 2."""
    if char.isascii():
        return 1
    return 0 if unicodedata.category(char) in ("Mn", "Me") else 2


def columns_of(stream: IO[str]) -> int:
    """The width of the terminal ``stream`` is on (stderr's own, not stdout's: a review
    saw stdout piped and stderr's 40-column pane cut at 80), or 80."""
    try:
        return os.get_terminal_size(stream.fileno()).columns or 80
    except (OSError, ValueError, AttributeError):
        return 80


def _rows(line: str, first: int, rest: int) -> list[str]:
    """``line`` cut into rows: the first at most ``first`` columns wide, the others
    ``rest``."""
    rows: list[str] = []
    row: list[str] = []
    used = 0
    for char in line:
        size = _width(char)
        if row and used + size > (rest if rows else first):
            rows.append("".join(row))
            row, used = [], 0
        row.append(char)
        used += size
    rows.append("".join(row))
    return rows


def terminal_rows(
    text: str, on_terminal: bool, prefix: str, first: str | None = None, columns: int | None = None
) -> str:
    """``text`` as the CLI prints what a job wrote or caused: on a terminal, escaped and
    cut into rows of the terminal's width, each starting with ``prefix`` (the very first
    with ``first``, the CLI's own words, if given), so no row of it starts like one of
    the CLI's. Off a terminal, as it is."""
    if not on_terminal:
        return text
    width = columns or 80
    lead = prefix if first is None else first
    out: list[str] = []
    for line in _safe(text, keep_lines=True).splitlines(True):
        body = line.removesuffix("\n")
        end = line[len(body) :]
        if "\t" in body:  # tab stops as the row has them; a long line's shown escaped
            wide = len(body) > MAX_TABBED_LINE  # (expanded, 4 MiB of tabs is 32 M columns)
            body = body.replace("\t", "\\x09") if wide else (lead + body).expandtabs()[len(lead) :]
        rows = _rows(body, max(8, width - len(lead)), max(8, width - len(prefix)))
        out.append(lead + f"\n{prefix}".join(rows) + end)
        lead = prefix
    return "".join(out)


def terminal_safe(text: str, on_terminal: bool, columns: int | None = None) -> str:
    """Job output: every screen row indented (``OUTPUT_PREFIX``). ``columns``: the
    terminal's width (columns_of), 80 if not given."""
    return terminal_rows(text, on_terminal, OUTPUT_PREFIX, columns=columns)

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

import shutil
import unicodedata

from rich.text import Text

_ESCAPED_CATEGORIES = {"Cc", "Cf", "Zl", "Zp", "Cs", "Cn"}
_KEPT = {"\n", "\t"}  # where text keeps its lines
OUTPUT_PREFIX = "  | "
MESSAGE_PREFIX = "    "


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
    """``text`` for rich as itself: one line, no markup read in it."""
    return Text(one_line(text))


def _width(char: str) -> int:
    """At least the columns any terminal gives ``char`` (never less: a row cut too short
    is only untidy, one cut too long wraps past its indent)."""
    if char.isascii():
        return 1
    if unicodedata.east_asian_width(char) in ("W", "F", "A"):
        return 2
    if unicodedata.category(char) in ("Mn", "Me"):
        return 0
    return 1 if unicodedata.category(char) != "Co" else 2


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
    width = columns or shutil.get_terminal_size().columns
    lead = prefix if first is None else first
    out: list[str] = []
    for line in _safe(text, keep_lines=True).splitlines(True):
        body = line.removesuffix("\n")
        end = line[len(body) :]
        body = (lead + body).expandtabs()[len(lead) :]  # tab stops as the row has them
        rows = _rows(body, max(8, width - len(lead)), max(8, width - len(prefix)))
        out.append(lead + f"\n{prefix}".join(rows) + end)
        lead = prefix
    return "".join(out)


def terminal_safe(text: str, on_terminal: bool, columns: int | None = None) -> str:
    """Job output: every screen row indented (``OUTPUT_PREFIX``)."""
    return terminal_rows(text, on_terminal, OUTPUT_PREFIX, columns=columns)

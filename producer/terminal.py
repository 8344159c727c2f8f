"""What the CLI prints of what a job or a spec holds (output, messages, labels, ids,
paths): a job must not move the cursor, erase lines, retitle the window or print a line
that passes for the farm's own. Control characters are shown escaped (``\\x1b``), and
rich markup in such text is never interpreted (an attack review, stop 39: a label
retitled the window and cleared the screen from `batch run`'s table, a step's path with
newlines printed `=== succeeded` lines of its own)."""

from __future__ import annotations

import shutil

from rich.cells import chop_cells
from rich.text import Text

# C0 and C1 control characters (newline and tab kept where text keeps its lines)
_CODES = [*range(0x20), *range(0x7F, 0xA0)]
_CONTROLS = {c: f"\\x{c:02x}" for c in _CODES if c not in (9, 10)}
_EVERY_CONTROL = {c: f"\\x{c:02x}" for c in _CODES}
PREFIX = "  | "


def one_line(text: str) -> str:
    """One line whatever ``text`` holds: every control character escaped, newlines too
    (what a message, a label or a field name is printed as, terminal or not)."""
    return text.translate(_EVERY_CONTROL)


def plain(text: str) -> Text:
    """``text`` for rich as itself: one line, no markup read in it."""
    return Text(one_line(text))


def terminal_safe(text: str, on_terminal: bool, columns: int | None = None) -> str:
    """Job output as the CLI shows it: on a terminal, control characters escaped and
    every screen row indented (long lines wrapped here, so none wraps past the indent
    onto a row of its own)."""
    if not on_terminal:
        return text
    width = max(8, (columns or shutil.get_terminal_size().columns) - len(PREFIX))
    rows: list[str] = []
    for line in text.translate(_CONTROLS).splitlines(True):
        body = line.rstrip("\n")
        end = line[len(body) :]
        body = (PREFIX + body).expandtabs()[len(PREFIX) :]  # tab stops as the row has them
        pieces = chop_cells(body, width) if body else [""]
        rows.extend(f"{PREFIX}{piece}\n" for piece in pieces[:-1])
        rows.append(f"{PREFIX}{pieces[-1]}{end}")
    return "".join(rows)

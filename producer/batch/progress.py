"""The batch's progress line: bar, done/total and a tally of every status so far, in the
console's width (80 columns included): when it does not fit, the ETA and elapsed time go
first, then the tally's names are abbreviated, then the label, then the bar; last, the
tally moves to a line of its own."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from rich.console import Console, Group, RenderableType
from rich.progress import (
    MofNCompleteColumn,
    Progress,
    ProgressBar,
    SpinnerColumn,
    Task,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Column, Table
from rich.text import Text

from producer.batch.summary import STATUS_STYLES

SHORT_NAMES = {
    "succeeded": "ok",
    "failed": "fail",
    "timed_out": "tmo",
    "memory_exceeded": "oom",
    "output_flooded": "flood",
    "crashed": "crash",
    "wrong_answer": "wa",
    "rejected": "rej",
    "error": "err",
    "cancelled": "canc",
}
BAR_MAX, BAR_MIN = 40, 10
# (short names, elapsed + ETA, "jobs" label), tried in turn: the first that fits wins
_LAYOUTS = (
    (False, True, True),
    (False, False, True),
    (True, True, True),
    (True, False, True),
    (True, False, False),
)


def tally(counts: Mapping[str, int], short: bool = False, width: int | None = None) -> Text:
    """``succeeded 12 failed 3``, most frequent first; ``short``: ``ok 12 fail 3``.
    ``width``: break into lines between entries (never inside one) to stay within it."""
    text = Text()
    used = 0
    for name, count in Counter(counts).most_common():
        label = SHORT_NAMES.get(name, name) if short else name
        entry = f"{label} {count}"
        if used and width is not None and used + 1 + len(entry) > width:
            text.append("\n")
            used = 0
        elif used:
            text.append(" ")
            used += 1
        text.append(entry, style=STATUS_STYLES.get(name, ""))
        used += len(entry)
    return text


class BatchProgress(Progress):
    """One line per task; its ``counts`` field (a status Counter) is the tally."""

    def __init__(self, console: Console, enabled: bool = True) -> None:
        self._spinner = SpinnerColumn()
        self._done = MofNCompleteColumn()
        self._elapsed = TimeElapsedColumn()
        self._remaining = TimeRemainingColumn()
        super().__init__(console=console, disable=not enabled, transient=False)

    def get_renderables(self) -> Iterable[RenderableType]:
        for task in self.tasks:
            if task.visible:
                yield self.line(task)

    def line(self, task: Task) -> RenderableType:
        width = self.console.width
        counts: Mapping[str, int] = task.fields.get("counts") or {}
        head: list[Text] = [_text(self._spinner.render(task)), Text(task.description, "bold")]
        done = self._done.render(task)
        times = [self._elapsed.render(task), self._remaining.render(task)]
        spinner, label = head
        for short, with_times, named in _LAYOUTS:
            lead = [spinner, label] if named else [spinner]
            cells = [*lead, done, *(times if with_times else []), tally(counts, short)]
            room = _room(width, cells)
            if room >= BAR_MIN:
                return _grid([*lead, _bar(task, room), *cells[len(lead) :]])
        bare = [spinner, done, tally(counts, short=True)]  # the bar is the least telling
        if _room(width, bare) >= 0:
            return _grid(bare)
        # Too many statuses for one line: the bar on one, the tally below (wrapped, if
        # need be, at spaces, never cut): every status stays in sight.
        cells = [*head, done, *times]
        if _room(width, cells) < BAR_MIN:
            cells = [*head, done]
        full = tally(counts)
        below = full if full.cell_len <= width else tally(counts, True, width)
        return Group(_grid([*head, _bar(task, max(1, _room(width, cells))), *cells[2:]]), below)


def _room(width: int, cells: list[Text]) -> int:
    """Columns left for a bar: one space between cells, the bar being one cell more."""
    return min(BAR_MAX, width - sum(c.cell_len for c in cells) - len(cells))


def _bar(task: Task, width: int) -> ProgressBar:
    return ProgressBar(
        total=max(0.0, task.total) if task.total is not None else None,
        completed=max(0.0, task.completed),
        width=width,
        animation_time=task.get_time(),
    )


def _text(renderable: RenderableType) -> Text:
    return renderable if isinstance(renderable, Text) else Text(str(renderable))


def _grid(cells: Sequence[RenderableType]) -> Table:
    grid = Table.grid(*(Column(no_wrap=True) for _ in cells), padding=(0, 1), expand=False)
    grid.add_row(*cells)
    return grid

"""The run of a batch: validate every line, then stream the pending specs to the farm
through a bounded window and write each result as it arrives."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from producer.batch.lines import LineError, iter_lines, parse_line
from producer.batch.results import ResultsWriter, load_previous
from producer.batch.summary import STATUS_STYLES, Summary
from producer.protocol import InputChangedError
from sandbox_core import JobResult, JobSpec, SpecError

DEFAULT_CHUNK = 500
DEFAULT_WINDOW_CHUNKS = 20  # jobs in flight: enough queued to keep a large farm busy


class BatchClient(Protocol):
    """The part of ``producer.client.FarmClient`` a batch run uses."""

    def submit_many(self, specs: Iterable[JobSpec]) -> list[str]: ...

    def as_completed(
        self, ids: Sequence[str], timeout: float | None = None
    ) -> Iterator[JobResult]: ...


@dataclass
class BatchReport:
    summary: Summary
    lines: int = 0  # non-blank input lines
    invalid: int = 0
    resumed: int = 0  # valid lines whose result was already in RESULTS
    submitted: int = 0
    received: int = 0
    missing: int = 0  # submitted or pending, no result before the deadline
    elapsed_s: float = 0.0

    @property
    def completed(self) -> bool:
        return self.missing == 0


@dataclass(frozen=True)
class _Pending:
    file_index: int
    line: int
    job_id: str


def _progress(console: Console, enabled: bool) -> Progress:
    return Progress(
        SpinnerColumn(),
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.fields[tally]}"),
        console=console,
        disable=not enabled,
        transient=False,
    )


def _tally(counts: Counter[str]) -> str:
    return " ".join(
        f"[{STATUS_STYLES.get(name, '')}]{name} {count}[/]" for name, count in counts.most_common()
    )


def run_batch(
    inputs: Sequence[Path],
    output: Path,
    client: BatchClient,
    *,
    chunk: int = DEFAULT_CHUNK,
    window: int | None = None,
    timeout: float | None = None,
    id_prefix: str | None = None,
    stderr: Console | None = None,
    progress: bool = True,
) -> BatchReport:
    """Run every valid line of ``inputs`` through ``client``; append results to ``output``.

    ``chunk`` specs go to the farm per ``submit_many`` call; at most ``window`` jobs
    (default 20 chunks) are in flight, topped up whenever half of them have finished.
    ``timeout`` bounds the whole wait for results: jobs without a result by then are
    counted as missing, and a rerun resumes them.
    """
    if chunk < 1:
        raise SpecError("chunk", "must be at least 1", chunk)
    window = max(window or DEFAULT_WINDOW_CHUNKS * chunk, chunk)
    err = stderr or Console(stderr=True)
    started = time.monotonic()
    deadline = None if timeout is None else started + timeout
    names = [path.name for path in inputs]
    prev = load_previous(output)
    summary = Summary()
    report = BatchReport(summary=summary)

    with output.open("a", encoding="utf-8") as fh:
        out = ResultsWriter(fh)
        if prev.needs_newline:  # the last run died mid-line: keep the torn line on its own
            fh.write("\n")
            fh.flush()

        # Pass 1: validate every line, report the bad ones, decide what still has to run.
        pending: list[_Pending] = []
        seen: dict[str, tuple[str, int]] = {}
        for index, path in enumerate(inputs):
            for line_no, text in iter_lines(path):
                report.lines += 1
                item = parse_line(names[index], line_no, text, id_prefix)
                if isinstance(item, JobSpec):
                    job_id = item.id
                    assert job_id is not None  # parse_line always gives one
                    first = seen.get(job_id)
                    if first is not None:
                        item = LineError(
                            names[index],
                            line_no,
                            f"id: {job_id!r} is already used by {first[0]} line {first[1]}",
                        )
                    else:
                        seen[job_id] = (names[index], line_no)
                if isinstance(item, LineError):
                    report.invalid += 1
                    err.print(
                        f"[yellow]{item.file}:{item.line}:[/] {escape(item.error)}",
                        highlight=False,
                        soft_wrap=True,
                    )
                    if (item.file, item.line) not in prev.errors:
                        out.write(json.dumps(item.record()))
                    continue
                assert item.id is not None
                if item.id in prev.results:
                    report.resumed += 1
                    summary.add(prev.results[item.id])
                else:
                    pending.append(_Pending(index, line_no, item.id))
        summary.invalid = report.invalid
        if report.resumed:
            err.print(
                f"resuming: {report.resumed} jobs already in {output}",
                highlight=False,
                soft_wrap=True,
                markup=False,
            )

        # Pass 2: stream the pending specs to the farm and collect results as they finish.
        specs = _iter_specs(inputs, names, pending, id_prefix)
        inflight: dict[str, None] = {}  # insertion-ordered set
        exhausted = not pending
        fresh: Counter[str] = Counter()
        bar = _progress(err, progress and bool(pending))
        with bar:
            task = bar.add_task("jobs", total=len(pending), tally="")
            while True:
                while not exhausted and len(inflight) < window:
                    size = min(chunk, window - len(inflight))
                    batch = [s for _, s in zip(range(size), specs, strict=False)]
                    if len(batch) < size:
                        exhausted = True
                    if batch:
                        for job_id in client.submit_many(batch):
                            inflight[job_id] = None
                        report.submitted += len(batch)
                if not inflight:
                    break
                # Collect until half the window is free (or, once all are sent, until the
                # end). Leaving as_completed early costs nothing: its next call begins by
                # fetching every result already stored for the ids still in flight.
                low_water = 0 if exhausted else window // 2
                remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
                got_any = False
                try:
                    for result in client.as_completed(list(inflight), timeout=remaining):
                        if result.id not in inflight:
                            continue  # never write a second line for one job
                        del inflight[result.id]
                        got_any = True
                        out.write(result.model_dump_json())
                        record = {
                            "id": result.id,
                            "status": result.status.value,
                            "timings": result.timings.model_dump(mode="json"),
                            "labels": result.labels,
                        }
                        summary.add(record)
                        fresh[result.status.value] += 1
                        report.received += 1
                        bar.update(task, advance=1, tally=_tally(fresh))
                        if len(inflight) <= low_water:
                            break
                except TimeoutError:
                    pass
                if deadline is not None and time.monotonic() >= deadline and inflight:
                    break
                if not got_any and inflight:
                    time.sleep(0.05)  # as_completed returned early: do not spin
        report.missing = len(inflight) + (len(pending) - report.submitted)
    report.elapsed_s = time.monotonic() - started
    return report


def _iter_specs(
    inputs: Sequence[Path], names: Sequence[str], pending: list[_Pending], prefix: str | None
) -> Iterator[JobSpec]:
    """Re-read the inputs and yield the pending lines' specs, in input order."""
    wanted: dict[tuple[int, int], str] = {(p.file_index, p.line): p.job_id for p in pending}
    for index, path in enumerate(inputs):
        if not any(key[0] == index for key in wanted):
            continue
        for line_no, text in iter_lines(path):
            job_id = wanted.get((index, line_no))
            if job_id is None:
                continue
            item = parse_line(names[index], line_no, text, prefix)
            if not isinstance(item, JobSpec) or item.id != job_id:
                raise InputChangedError(str(path), line_no)
            yield item


def print_summary(report: BatchReport, console: Console | None = None) -> None:
    """The closing summary table."""
    (console or Console()).print(
        report.summary.render(report.elapsed_s, resumed=report.resumed, missing=report.missing)
    )

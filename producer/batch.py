"""Batch runs: JobSpecs as JSONL in, one JobResult JSON per line out; resumable.

Each non-blank input line is one JobSpec. A line that is not JSON or not a valid spec
becomes ``{"line": N, "file": ..., "error": "<field>: <reason>"}`` in RESULTS (and a
message on stderr) while the valid lines still run. A line without an ``id`` gets one
derived from the file name, the line number and a hash of the line, so a rerun with the
same RESULTS skips every job already answered there (resume).

Input is read twice (once to validate and count, once to submit chunk by chunk), so
memory holds ids, not specs, whatever the size of the batch. At most ``window`` jobs
are in flight; results are appended and flushed one by one as they arrive, so a crash
loses nothing already received, and the farm's idempotent ids make the rerun safe.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol

from rich.console import Console, Group
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
from rich.table import Table
from rich.text import Text

from sandbox_core import JobResult, JobSpec, SpecError, parse_spec

__all__ = [
    "BatchClient",
    "BatchReport",
    "LineError",
    "Summary",
    "derive_id",
    "parse_line",
    "percentile",
    "print_summary",
    "read_results",
    "run_batch",
]

DEFAULT_CHUNK = 500
DEFAULT_WINDOW_CHUNKS = 20  # jobs in flight: enough queued to keep a large farm busy
EXPECT_LABEL = "expect"  # a label naming the status a job is expected to end with
STATUS_STYLES = {
    "succeeded": "green",
    "failed": "red",
    "timed_out": "yellow",
    "memory_exceeded": "magenta",
    "output_flooded": "magenta",
    "crashed": "bold red",
    "rejected": "yellow",
    "error": "bold red",
    "cancelled": "dim",
    "invalid": "bold yellow",
}
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


class BatchClient(Protocol):
    """The part of ``producer.client.FarmClient`` a batch run uses."""

    def submit_many(self, specs: Iterable[JobSpec]) -> list[str]: ...

    def as_completed(
        self, ids: Sequence[str], timeout: float | None = None
    ) -> Iterator[JobResult]: ...


# ---------------------------------------------------------------- input lines


@dataclass(frozen=True)
class LineError:
    """One input line that could not become a job."""

    file: str
    line: int
    error: str

    def record(self) -> dict[str, Any]:
        return {"line": self.line, "file": self.file, "error": self.error}


def _safe(text: str, limit: int) -> str:
    cleaned = _UNSAFE.sub("-", text).strip("-.")[:limit]
    return cleaned if cleaned[:1].isalnum() else f"j{cleaned}"[:limit]


def derive_id(file_name: str, line_no: int, text: str, prefix: str | None = None) -> str:
    """A stable job id for a line without one: name, line number and content hash.

    The same line of the same file always gets the same id (so resume and the farm's
    idempotency recognise it); an edited line gets a new one. Only the file's base name
    counts, so moving the input or running from another directory still resumes.
    """
    digest = hashlib.sha256(text.strip().encode("utf-8", "surrogatepass")).hexdigest()[:16]
    stem = _safe(Path(file_name).name.removesuffix(".jsonl"), 64) or "batch"
    job_id = f"{stem}:{line_no}:{digest}"
    if prefix:
        job_id = f"{_safe(prefix, 32)}:{job_id}"
    return job_id


def parse_line(
    file_name: str, line_no: int, text: str, prefix: str | None = None
) -> JobSpec | LineError:
    """One JSONL line to a JobSpec with an id, or the LineError saying why not."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:  # RecursionError: absurdly deep nesting
        reason = getattr(exc, "msg", str(exc))
        column = getattr(exc, "colno", None)
        where = f" (column {column})" if column else ""
        return LineError(file_name, line_no, f"json: not valid JSON: {reason}{where}")
    if not isinstance(data, dict):
        return LineError(
            file_name, line_no, f"job: a job is a JSON object, got {type(data).__name__}"
        )
    try:
        spec = parse_spec(data)
    except SpecError as exc:
        return LineError(file_name, line_no, str(exc))
    if spec.id is None:  # an explicit id is the client's idempotency key: kept as given
        spec.id = derive_id(file_name, line_no, text, prefix)
    return spec


def iter_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(1-based line number, text) for every non-blank line."""
    with path.open(encoding="utf-8", errors="surrogateescape") as fh:
        for number, raw in enumerate(fh, start=1):
            text = raw.strip()
            if text:
                yield number, text


# ---------------------------------------------------------------- summary


def percentile(values: Sequence[float], pct: float) -> float | None:
    """Nearest-rank percentile (pct in 0..100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(pct / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.0f} ms" if value < 1000 else f"{value / 1000:.2f} s"


@dataclass
class Summary:
    """What a batch produced: counts by status, run time and queue wait, expectations."""

    statuses: Counter[str] = field(default_factory=Counter)
    run_ms: list[float] = field(default_factory=list)
    queue_wait_ms: list[float] = field(default_factory=list)
    invalid: int = 0
    expected: int = 0
    mismatches: list[tuple[str, str, str]] = field(default_factory=list)  # id, expected, got

    def add(self, record: dict[str, Any]) -> None:
        """Count one result, given as its JSON dict (as stored in RESULTS)."""
        status = str(record.get("status"))
        self.statuses[status] += 1
        timings = record.get("timings") or {}
        if isinstance(timings.get("run_ms"), int | float):
            self.run_ms.append(float(timings["run_ms"]))
        if isinstance(timings.get("queue_wait_ms"), int | float):
            self.queue_wait_ms.append(float(timings["queue_wait_ms"]))
        expect = (record.get("labels") or {}).get(EXPECT_LABEL)
        if expect:
            self.expected += 1
            if expect != status:
                self.mismatches.append((str(record.get("id")), expect, status))

    @property
    def jobs(self) -> int:
        return sum(self.statuses.values())

    def render(self, elapsed_s: float | None = None, resumed: int = 0, missing: int = 0) -> Group:
        counts = Table(title="sandfarm batch", title_justify="left", show_edge=False)
        counts.add_column("status")
        counts.add_column("jobs", justify="right")
        counts.add_column("share", justify="right")
        total = self.jobs + self.invalid
        rows = [*self.statuses.most_common()]
        if self.invalid:
            rows.append(("invalid", self.invalid))
        for status, count in rows:
            share = f"{100 * count / total:.0f}%" if total else "-"
            counts.add_row(Text(status, style=STATUS_STYLES.get(status, "")), str(count), share)
        counts.add_section()
        counts.add_row("total", str(total), "")

        timing = Table(show_edge=False)
        timing.add_column("")
        for name in ("p50", "p95", "max"):
            timing.add_column(name, justify="right")
        for name, values in (("run time", self.run_ms), ("queue wait", self.queue_wait_ms)):
            top = max(values) if values else None
            timing.add_row(name, _ms(percentile(values, 50)), _ms(percentile(values, 95)), _ms(top))

        parts: list[Any] = [counts, Text(""), timing, Text("")]
        fresh = self.jobs - resumed
        line = f"{self.jobs} results"
        if elapsed_s and fresh:
            line += f": {fresh} new in {elapsed_s:.1f} s ({fresh / elapsed_s:.1f} jobs/s)"
        if resumed:
            line += f"; {resumed} from an earlier run (resumed)"
        parts.append(Text(line))
        if self.invalid:
            parts.append(Text(f"{self.invalid} invalid input lines (see RESULTS and stderr)"))
        if missing:
            parts.append(Text(f"{missing} still without a result: rerun to resume", "bold red"))
        if self.expected:
            matched = self.expected - len(self.mismatches)
            style = "green" if not self.mismatches else "yellow"
            parts.append(
                Text(f"expected status: {matched}/{self.expected} as labelled", style=style)
            )
            for job_id, want, got in self.mismatches[:10]:
                parts.append(Text(f"  {job_id}: expected {want}, got {got}", style="yellow"))
            if len(self.mismatches) > 10:
                parts.append(Text(f"  ... and {len(self.mismatches) - 10} more"))
        return Group(*parts)


# ---------------------------------------------------------------- RESULTS file


@dataclass
class _Previous:
    results: dict[str, dict[str, Any]] = field(default_factory=dict)  # id -> light record
    errors: set[tuple[str, int]] = field(default_factory=set)  # (file, line) already written
    needs_newline: bool = False


def read_results(path: Path) -> Iterator[dict[str, Any]]:
    """Every parseable JSON object in RESULTS; a torn last line (a crash) is ignored."""
    if not path.exists():
        return
    with path.open(encoding="utf-8", errors="replace") as fh:
        for raw in fh:
            try:
                record = json.loads(raw)
            except ValueError:
                continue
            if isinstance(record, dict):
                yield record


def _load_previous(path: Path) -> _Previous:
    prev = _Previous()
    for record in read_results(path):
        if isinstance(record.get("id"), str) and "status" in record:
            timings = record.get("timings") or {}
            prev.results[record["id"]] = {
                "id": record["id"],
                "status": record["status"],
                "timings": {k: timings.get(k) for k in ("run_ms", "queue_wait_ms")},
                "labels": {EXPECT_LABEL: (record.get("labels") or {}).get(EXPECT_LABEL)},
            }
        elif "error" in record and isinstance(record.get("line"), int):
            prev.errors.add((str(record.get("file", "")), record["line"]))
    if path.exists() and path.stat().st_size:
        with path.open("rb") as fh:
            fh.seek(-1, 2)
            prev.needs_newline = fh.read(1) != b"\n"
    return prev


# ---------------------------------------------------------------- the run


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


class _Writer:
    """Appends one JSON document per line to RESULTS, flushed at once."""

    def __init__(self, fh: IO[str]) -> None:
        self.fh = fh

    def write(self, text: str) -> None:
        self.fh.write(text + "\n")
        self.fh.flush()


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
        raise ValueError("chunk must be at least 1")
    window = max(window or DEFAULT_WINDOW_CHUNKS * chunk, chunk)
    err = stderr or Console(stderr=True)
    started = time.monotonic()
    deadline = None if timeout is None else started + timeout
    names = [path.name for path in inputs]
    prev = _load_previous(output)
    summary = Summary()
    report = BatchReport(summary=summary)

    with output.open("a", encoding="utf-8") as fh:
        out = _Writer(fh)
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
                    assert item.id is not None
                    first = seen.get(item.id)
                    if first is not None:
                        item = LineError(
                            names[index],
                            line_no,
                            f"id: {item.id!r} is already used by {first[0]} line {first[1]}",
                        )
                    else:
                        seen[item.id] = (names[index], line_no)
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
                raise RuntimeError(f"{path}: line {line_no} changed during the batch run")
            yield item


def print_summary(report: BatchReport, console: Console | None = None) -> None:
    """The closing summary table."""
    (console or Console()).print(
        report.summary.render(report.elapsed_s, resumed=report.resumed, missing=report.missing)
    )

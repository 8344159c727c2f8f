"""The run of a batch: validate every line, then stream the pending specs to the farm
through a bounded window and write each result as it arrives."""

from __future__ import annotations

import fcntl
import json
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Protocol

from rich.console import Console

from producer.batch import ledger
from producer.batch.groups import Groups
from producer.batch.lines import Defaults, LineError, iter_lines, parse, parse_line
from producer.batch.progress import BatchProgress
from producer.batch.results import Previous, ResultsWriter, load_previous
from producer.batch.summary import EXPECT_LABEL, Summary
from producer.protocol import IdConflictError, InputChangedError, JobsLostError
from producer.terminal import MESSAGE_PREFIX, one_line, terminal_rows
from sandbox_core import JobResult, JobSpec, SpecError

DEFAULT_CHUNK = 500
DEFAULT_WINDOW_CHUNKS = 20  # jobs in flight: enough queued to keep a large farm busy


class BatchClient(Protocol):
    """The part of ``producer.client.FarmClient`` a batch run uses."""

    def submit_many(self, specs: Iterable[JobSpec]) -> list[str]: ...

    def as_completed(
        self,
        ids: Sequence[str],
        timeout: float | None = None,
        *,
        notice: Callable[[str], None] | None = None,
    ) -> Iterator[JobResult]: ...


@dataclass(frozen=True)
class BatchInput:
    """An input file and the name its lines go by (derived ids, error records)."""

    path: Path
    name: str

    @classmethod
    def of(cls, item: Path | BatchInput) -> BatchInput:
        return item if isinstance(item, BatchInput) else cls(item, item.name)


@dataclass
class BatchReport:
    summary: Summary
    lines: int = 0  # non-blank input lines
    invalid: int = 0  # bad JSON, bad spec, repeated id, id taken by another job
    conflicts: int = 0  # of those: ids the farm holds for a different spec
    resumed: int = 0  # valid lines whose result was already in RESULTS
    submitted: int = 0  # accepted by the farm in this run
    received: int = 0
    earlier: int = 0  # of those: done before this run began (the farm's stored result)
    missing: int = 0  # submitted or pending, no result before the deadline
    elapsed_s: float = 0.0
    interrupted: bool = False  # Ctrl-C
    unanswered: list[str] = field(default_factory=list)  # submitted here, no result yet
    maybe_submitted: list[str] = field(default_factory=list)  # the submit Ctrl-C cut short

    @property
    def completed(self) -> bool:
        return self.missing == 0 and not self.interrupted


@dataclass(frozen=True)
class _Pending:
    file_index: int
    line: int
    job_id: str


def conflict_error(file: str, line: int, job_id: str) -> LineError:
    return LineError(
        file,
        line,
        f"id: {job_id!r} already names a different job (the farm holds another spec"
        " under it): give this line another id, or run with a new --id-prefix",
    )


class _Run:
    """One invocation's state: what is pending, in flight, received."""

    def __init__(
        self,
        inputs: Sequence[BatchInput],
        out: ResultsWriter,
        prev: Previous,
        client: BatchClient,
        err: Console,
        *,
        id_prefix: str | None,
        defaults: Defaults | None,
        recorded: ledger.Recorded | None,
        groups: Groups | None = None,
    ) -> None:
        self.inputs, self.out, self.prev, self.client, self.err = inputs, out, prev, client, err
        self.id_prefix, self.defaults, self.recorded = id_prefix, defaults, recorded
        self.summary = Summary(groups=groups)
        self.report = BatchReport(summary=self.summary)
        self.began = datetime.now(UTC)  # results that started before this are not new
        self.pending: list[_Pending] = []
        self.where: dict[str, tuple[str, int]] = {}  # id -> (file, line), for conflicts
        self.inflight: dict[str, None] = {}  # insertion-ordered set
        self.sending: list[str] = []  # ids of a submit_many call under way
        self.sent = 0  # pending specs whose submit_many call returned

    def line_error(self, item: LineError) -> None:
        self.report.invalid += 1
        self.summary.invalid = self.report.invalid
        self._say(f"{one_line(item.file)}:{item.line}: {one_line(item.error)}")
        if (item.file, item.line) not in self.prev.errors:
            self.out.write(json.dumps(item.record()))

    def notice(self, message: str) -> None:
        # The bar's own console: the line goes above the live bar, which stays intact.
        self._say(f"sandfarm: {one_line(message)}")

    def _say(self, line: str) -> None:
        """A line that may quote the input: on a terminal cut into rows here, every one
        after the first indented (soft-wrapped by the terminal, a line of a label's
        spaces put its words at column 0: a review)."""
        rows = terminal_rows(line, self.err.is_terminal, MESSAGE_PREFIX, "", self.err.width)
        self.err.print(rows, markup=False, highlight=False, soft_wrap=True)

    # --- pass 1: validate every line, report the bad ones, decide what still runs -----

    def validate(self) -> None:
        report = self.report
        resumed: list[tuple[str, str, int]] = []  # (id, file, line)
        to_check: dict[str, str] = {}  # resumed lines' own ids -> their spec's hash now
        seen: dict[str, tuple[str, int]] = {}
        for index, source in enumerate(self.inputs):
            for line_no, text in iter_lines(source.path):
                report.lines += 1
                parsed = parse(source.name, line_no, text, self.id_prefix, self.defaults)
                item = parsed.item
                if isinstance(item, JobSpec):
                    job_id = item.id
                    assert job_id is not None  # parse always gives one
                    first = seen.get(job_id)
                    if first is not None:
                        item = LineError(
                            source.name,
                            line_no,
                            f"id: {job_id!r} is already used by {first[0]} line {first[1]}",
                        )
                    else:
                        seen[job_id] = (source.name, line_no)
                if isinstance(item, LineError):
                    self.line_error(item)
                    continue
                assert item.id is not None
                if item.id in self.prev.results:
                    resumed.append((item.id, source.name, line_no))
                    if parsed.explicit and self.recorded is not None:
                        to_check[item.id] = ledger.digest(item)
                else:
                    self.pending.append(_Pending(index, line_no, item.id))
                    self.where[item.id] = (source.name, line_no)
        stale = ledger.changed(self.recorded, to_check) if to_check and self.recorded else set()
        for job_id, name, line_no in resumed:
            if job_id in stale:  # RESULTS holds the verdict of the line's old spec
                report.conflicts += 1
                self.line_error(conflict_error(name, line_no, job_id))
            else:
                report.resumed += 1
                self.summary.add(self.prev.results[job_id])

    # --- pass 2: stream the pending specs, collect results as they finish -------------

    def submit(self, batch: list[JobSpec]) -> None:
        self.sending = [spec.id or "" for spec in batch]
        try:
            accepted = self.client.submit_many(batch)
        except IdConflictError as exc:  # the others were sent: only these lines fail
            accepted = exc.submitted
            for job_id in exc.conflicts:
                name, line_no = self.where.get(job_id, ("?", 0))
                self.report.conflicts += 1
                self.line_error(conflict_error(name, line_no, job_id))
        self.sending = []
        self.sent += len(batch)
        for job_id in accepted:
            self.inflight[job_id] = None
        self.report.submitted += len(accepted)

    def receive(self, result: JobResult) -> None:
        del self.inflight[result.id or ""]
        self.out.write(result.model_dump_json())
        self.summary.add(
            {
                "id": result.id,
                "status": result.status.value,
                "timings": result.timings.model_dump(mode="json"),
                "labels": result.labels,
            }
        )
        self.report.received += 1
        started = result.timings.started_at or result.timings.finished_at
        if started is not None:
            if started.tzinfo is None:
                started = started.replace(tzinfo=UTC)
            # worker and client clocks are assumed to agree (NTP): skew shifts this line
            if started < self.began:  # the same id and spec, answered by an earlier run
                self.report.earlier += 1

    def stream(self, bar: BatchProgress, chunk: int, window: int, deadline: float | None) -> None:
        specs = _iter_specs(self.inputs, self.pending, self.id_prefix, self.defaults)
        exhausted = not self.pending
        counts: Counter[str] = Counter()
        with bar:
            task = bar.add_task("jobs", total=len(self.pending), counts=counts)
            while True:
                while not exhausted and len(self.inflight) < window:
                    size = min(chunk, window - len(self.inflight))
                    batch = [s for _, s in zip(range(size), specs, strict=False)]
                    exhausted = len(batch) < size
                    if batch:
                        self.submit(batch)
                        bar.update(task, total=len(self.pending) - self.report.conflicts)
                if not self.inflight:
                    break
                # Collect until half the window is free (or, once all are sent, until the
                # end). Leaving as_completed early costs nothing: its next call begins by
                # fetching every result already stored for the ids still in flight.
                low_water = 0 if exhausted else window // 2
                remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
                got_any = False
                try:
                    results = self.client.as_completed(
                        list(self.inflight), timeout=remaining, notice=self.notice
                    )
                    for result in results:
                        if result.id not in self.inflight:
                            continue  # never write a second line for one job
                        got_any = True
                        self.receive(result)
                        counts[result.status.value] += 1
                        bar.update(task, advance=1, counts=counts)
                        if len(self.inflight) <= low_water:
                            break
                except TimeoutError:
                    pass
                except JobsLostError as exc:  # they never finish: stop, a rerun resubmits
                    self.notice(str(exc))
                    break
                if deadline is not None and time.monotonic() >= deadline and self.inflight:
                    break
                if not got_any and self.inflight:
                    time.sleep(0.05)  # as_completed returned early: do not spin

    def finish(self) -> BatchReport:
        report = self.report
        report.missing = len(self.inflight) + len(self.pending) - self.sent
        report.unanswered = list(self.inflight)
        report.maybe_submitted = list(self.sending)
        return report


def _own(path: Path) -> IO[str]:
    """RESULTS opened to append, held for this run alone (an exclusive lock, gone with the
    process): two runs at once each wrote every result, doubling the file (a review)."""
    fh = path.open("a", encoding="utf-8")
    try:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.close()
        raise SpecError(
            str(path), "another `sandfarm batch run` writes it now: wait for it to end"
        ) from None
    return fh


def run_batch(
    inputs: Sequence[Path | BatchInput],
    output: Path | IO[str],
    client: BatchClient,
    *,
    chunk: int = DEFAULT_CHUNK,
    window: int | None = None,
    wait_timeout: float | None = None,
    id_prefix: str | None = None,
    defaults: Defaults | None = None,
    stderr: Console | None = None,
    progress: bool = True,
    recorded: ledger.Recorded | None = None,
    groups: Groups | None = None,
) -> BatchReport:
    """Run every valid line of ``inputs`` through ``client``; append results to ``output``.

    ``output`` is RESULTS (a path: ids already answered there are skipped) or a stream
    (nothing to resume from). ``chunk`` specs go to the farm per ``submit_many`` call; at
    most ``window`` jobs (default 20 chunks) are in flight, topped up whenever half of them
    have finished. ``wait_timeout`` bounds the whole wait for results: jobs without one by
    then are counted as missing, and a rerun resumes them. ``defaults`` fill in what lines
    leave unset. ``recorded`` looks up the spec hashes the farm holds (default: the
    client's own, for a FarmClient), so a resumed line whose own id now names another spec
    is refused instead of resumed. ``groups`` (a label) adds pass counts and pass@k per
    group to the summary. Ctrl-C ends the run with ``report.interrupted`` set.
    """
    if chunk < 1:
        raise SpecError("chunk", "must be at least 1", chunk)
    window = max(window or DEFAULT_WINDOW_CHUNKS * chunk, chunk)
    err = stderr or Console(stderr=True)
    started = time.monotonic()
    deadline = None if wait_timeout is None else started + wait_timeout
    sources = [BatchInput.of(item) for item in inputs]
    to_file = isinstance(output, Path)
    fh = _own(output) if isinstance(output, Path) else output
    try:
        if recorded is None:
            recorded = ledger.farm_recorded(client)
        keep = (EXPECT_LABEL, groups.label) if groups is not None else (EXPECT_LABEL,)
        prev = load_previous(output, keep) if isinstance(output, Path) else Previous()
        run = _Run(
            sources,
            ResultsWriter(fh),
            prev,
            client,
            err,
            id_prefix=id_prefix,
            defaults=defaults,
            recorded=recorded,
            groups=groups,
        )
        if prev.needs_newline:  # the last run died mid-line: keep the torn line on its own
            run.out.write("")
        try:
            run.validate()
            if run.report.resumed:
                err.print(
                    f"resuming: {run.report.resumed} jobs already in {output}",
                    highlight=False,
                    soft_wrap=True,
                    markup=False,
                )
            bar = BatchProgress(err, enabled=progress and bool(run.pending))
            run.stream(bar, chunk, window, deadline)
        except KeyboardInterrupt:
            run.report.interrupted = True
    finally:
        if to_file:
            fh.close()
    report = run.finish()
    report.elapsed_s = time.monotonic() - started
    return report


def _iter_specs(
    inputs: Sequence[BatchInput],
    pending: list[_Pending],
    prefix: str | None,
    defaults: Defaults | None,
) -> Iterator[JobSpec]:
    """Re-read the inputs and yield the pending lines' specs, in input order."""
    wanted: dict[tuple[int, int], str] = {(p.file_index, p.line): p.job_id for p in pending}
    for index, source in enumerate(inputs):
        if not any(key[0] == index for key in wanted):
            continue
        for line_no, text in iter_lines(source.path):
            job_id = wanted.get((index, line_no))
            if job_id is None:
                continue
            item = parse_line(source.name, line_no, text, prefix, defaults)
            if not isinstance(item, JobSpec) or item.id != job_id:
                raise InputChangedError(source.name, line_no)
            yield item


def print_summary(
    report: BatchReport, console: Console | None = None, missing_hint: str = "rerun to resume"
) -> None:
    """The closing summary table."""
    (console or Console()).print(
        report.summary.render(
            report.elapsed_s,
            resumed=report.resumed,
            missing=report.missing,
            earlier=report.earlier,
            missing_hint=missing_hint,
        )
    )

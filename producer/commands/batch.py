"""`sandfarm batch ...`: JSONL in, JSONL out, through the farm."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, BinaryIO

import click

from producer.commands.common import closing_client, fail, job_client
from sandbox_core import BACKEND_NAMES, SpecError, parse_spec

if TYPE_CHECKING:
    from rich.console import Console

    from producer.batch import BatchReport, Defaults
    from producer.jobclient import JobClient

MAX_STDIN_BYTES = 1 << 30  # input `-` is spooled to disk: bounded, so a runaway pipe stops
_SPOOL_CHUNK = 1 << 20
RERUN = "rerun to resume"
_FLAGS = {
    "backend": "--backend",
    "limits.timeout_s": "--timeout",
    "limits.memory_mb": "--memory-mb",
}


def register(group: click.Group) -> None:
    """Add the batch commands to the `sandfarm` group."""
    group.add_command(batch)


@click.group()
def batch() -> None:
    """Run many jobs from JSONL files through the farm."""


@batch.command("run")
@click.argument(
    "jobs",
    nargs=-1,
    required=True,
    type=click.Path(exists=True, dir_okay=False, readable=True, allow_dash=True, path_type=Path),
)
@click.option(
    "-o",
    "--output",
    required=True,
    type=click.Path(dir_okay=False, writable=True, allow_dash=True, path_type=Path),
    help="RESULTS.jsonl: one JobResult per line, appended; ids already there are skipped."
    " `-`: results to stdout (progress and summary on stderr; nothing to resume from)",
)
@click.option("--redis-url", envvar="SANDFARM_REDIS_URL", help="Redis URL [env SANDFARM_REDIS_URL]")
@click.option(
    "--api", envvar="SANDFARM_API", help="a gateway URL: run as its tenant (SANDFARM_API_KEY)"
)
@click.option(
    "--backend",
    type=click.Choice(BACKEND_NAMES),
    help="backend of the lines that name none (default: the worker's)",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=float,
    help="wall-clock limit in seconds of the lines without limits.timeout_s (as in `run`)",
)
@click.option("--memory-mb", type=int, help="memory limit of the lines without limits.memory_mb")
@click.option(
    "--wait-timeout",
    type=click.FloatRange(min=0, min_open=True),
    help="stop waiting for results after S seconds (exit 1; rerun to resume)",
)
@click.option(
    "--chunk",
    type=click.IntRange(1, 100_000),
    default=500,
    show_default=True,
    help="jobs per submit_many call; up to 20 chunks are in flight",
)
@click.option(
    "--id-prefix",
    help="namespace of every id of the batch, the lines' own ids too (PREFIX:ID; a"
    " line whose id then passes 128 characters is invalid): a new prefix runs all afresh",
)
@click.option(
    "--strict",
    is_flag=True,
    help="exit 2 if any line is invalid (bad JSON or spec, id taken by another job);"
    " the valid lines still run and their results are written",
)
@click.option(
    "--cancel-on-interrupt",
    is_flag=True,
    help="on Ctrl-C, cancel the jobs this run submitted that have no result yet",
)
@click.option(
    "--progress/--no-progress",
    default=None,
    help="progress bar on stderr (default: on a tty, unless -o - writes to that tty too)",
)
@click.option(
    "--group-by",
    help="labels.NAME: pass counts (succeeded) and pass@k per value of that label",
)
@click.option(
    "--summary-json",
    type=click.Path(dir_okay=False, writable=True, path_type=Path),
    help="also write the summary (statuses, times, groups and pass@k) as JSON to FILE",
)
def run(
    jobs: tuple[Path, ...],
    output: Path,
    redis_url: str | None,
    api: str | None,
    backend: str | None,
    timeout_s: float | None,
    memory_mb: int | None,
    wait_timeout: float | None,
    chunk: int,
    id_prefix: str | None,
    strict: bool,
    cancel_on_interrupt: bool,
    progress: bool | None,
    group_by: str | None,
    summary_json: Path | None,
) -> None:
    """Run every job of JOBS (JSONL, one JobSpec per line; `-` reads stdin, once) and
    append one result per line to -o RESULTS.

    A line that is not a valid spec, or whose id the farm already holds for a different
    spec, is reported on stderr and in RESULTS as {"line": N, "file": ..., "error":
    "<field>: <reason>"}; the valid lines still run. A line without an id gets one from
    the file's name (`stdin` for `-`), the line number and a hash of the line and of the
    defaults it takes (--backend, --timeout, --memory-mb); rerunning with the same RESULTS
    skips every id already answered there.

    Exit 0 when every job has a result, whatever its status; 1 when the farm failed or
    --wait-timeout passed first (rerun to resume; 1 wins over --strict's 2); 2 on bad
    usage, and with --strict when any line was invalid (bad JSON or spec, id taken by
    another job; the valid lines' results are still written); 130 on Ctrl-C.
    """
    from rich.console import Console

    from producer.batch import STDIN_NAME, BatchInput, Defaults, print_summary, run_batch
    from producer.batch.groups import Groups, label_of

    to_stdout = str(output) == "-"
    stdin_count = sum(str(path) == "-" for path in jobs)
    files = [path for path in jobs if str(path) != "-"]
    if stdin_count > 1:
        fail("- (stdin) is given twice")
    if not to_stdout and any(path.resolve() == output.resolve() for path in files):
        fail(f"-o {output} is also an input file")
    if len({path.resolve() for path in files}) != len(files):
        fail("an input file is given twice")
    if summary_json is not None:  # it would replace RESULTS or an input (a review)
        taken = [*files, *([] if to_stdout else [output])]
        if any(summary_json.resolve() == path.resolve() for path in taken):
            fail(f"--summary-json {summary_json} is also the RESULTS file or an input file")
    names = [STDIN_NAME if str(path) == "-" else path.name for path in jobs]
    if len({name.removesuffix(".jsonl") for name in names}) != len(names):
        fail(
            "input files need distinct names, .jsonl aside (- is `stdin`): derived ids and"
            " error lines use them"
        )
    if id_prefix is not None:
        _check_prefix(id_prefix)
    defaults = _defaults(Defaults, backend, timeout_s, memory_mb)
    try:
        groups = Groups(label_of(group_by)) if group_by is not None else None
    except SpecError as exc:
        fail(str(exc))

    err = Console(stderr=True)
    if not err.is_terminal:  # a log file: room for the final progress line, unwrapped
        err = Console(stderr=True, width=max(err.width, 160))
    # results on the same terminal would cut through a live bar: none unless asked for
    default = err.is_terminal and not (to_stdout and sys.stdout.isatty())
    show = default if progress is None else progress
    with _spooled_stdin(stdin_count > 0, err) as spool:
        inputs = [
            BatchInput(spool, STDIN_NAME) if str(path) == "-" and spool else BatchInput(path, name)
            for path, name in zip(jobs, names, strict=True)
        ]
        so_far = "went to stdout" if to_stdout else f"are in {output}"
        hint = _resume_hint(to_stdout, stdin_count > 0)
        try:
            with closing_client(job_client(redis_url, api)) as client:
                report = run_batch(
                    inputs,
                    sys.stdout if to_stdout else output,
                    client,
                    chunk=chunk,
                    wait_timeout=wait_timeout,
                    id_prefix=id_prefix,
                    defaults=defaults,
                    stderr=err,
                    progress=show,
                    groups=groups,
                )
                if summary_json is not None:
                    _write_json(summary_json, report.summary.as_json())
                summary_console = err if to_stdout else Console()
                short = hint if hint == RERUN else ""  # a long hint is the last line instead
                print_summary(report, summary_console, missing_hint=short)
                if report.interrupted:
                    _interrupted(report, client, cancel_on_interrupt, so_far, hint, err)
        except KeyboardInterrupt:  # before anything was submitted (or while closing)
            err.print(f"interrupted: results so far {so_far}", markup=False)
            sys.exit(130)
        except BrokenPipeError:
            _quiet_stdout()
            fail("stdout was closed: the results not yet written are lost", code=1)
        except Exception as exc:  # the farm (Redis, the client) failed: one line, exit 1
            fail(f"batch failed: {type(exc).__name__}: {exc}", code=1)
    if not report.completed:
        fail(f"{report.missing} jobs have no result yet; {hint}", code=1)
    if strict and report.invalid:
        where = "stdout" if to_stdout else output
        fail(f"--strict: {report.invalid} invalid input lines (see stderr and {where})")


def _write_json(path: Path, data: dict[str, object]) -> None:
    import json

    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def _check_prefix(prefix: str) -> None:
    from producer.batch import safe_prefix

    if not prefix or safe_prefix(prefix) != prefix:
        fail(
            f"--id-prefix {prefix!r}: use 1-32 of [A-Za-z0-9._-], starting with a letter"
            f" or digit (e.g. {safe_prefix(prefix or 'run')!r})"
        )


def _defaults(
    make: type[Defaults], backend: str | None, timeout_s: float | None, memory_mb: int | None
) -> Defaults | None:
    """The batch defaults, validated like any spec field (one line naming the flag)."""
    if backend is None and timeout_s is None and memory_mb is None:
        return None
    given = (("timeout_s", timeout_s), ("memory_mb", memory_mb))
    limits = {name: value for name, value in given if value is not None}
    try:
        parse_spec({"command": "true", "backend": backend, "limits": limits})
    except SpecError as exc:
        fail(f"{_FLAGS.get(exc.field, exc.field)}: {exc.reason}")
    return make(backend=backend, timeout_s=timeout_s, memory_mb=memory_mb)


@contextlib.contextmanager
def _spooled_stdin(wanted: bool, err: Console) -> Iterator[Path | None]:
    """Input `-` copied once to a private temporary file (bounded), removed at the end:
    a batch reads its input twice (validate, then submit), a pipe can be read once."""
    if not wanted:
        yield None
        return
    if sys.stdin.isatty():
        err.print("reading jobs from stdin (one JobSpec per line; end with Ctrl-D)", markup=False)
    fd, name = tempfile.mkstemp(prefix="sandfarm-stdin-", suffix=".jsonl")  # mode 0600
    path = Path(name)
    try:
        with os.fdopen(fd, "wb") as sink:
            try:
                _copy_bounded(sys.stdin.buffer, sink)
            except KeyboardInterrupt:
                fail("interrupted while reading stdin: nothing was submitted", code=130)
        yield path
    finally:
        path.unlink(missing_ok=True)


def _copy_bounded(source: BinaryIO | IO[bytes], sink: IO[bytes]) -> None:
    copied = 0
    while block := source.read(_SPOOL_CHUNK):
        copied += len(block)
        if copied > MAX_STDIN_BYTES:
            limit = f"{MAX_STDIN_BYTES >> 30} GiB"
            fail(f"stdin: more than {limit} of jobs; save them to a file and run that")
        sink.write(block)


def _resume_hint(to_stdout: bool, from_stdin: bool) -> str:
    if to_stdout:
        return (
            "-o - keeps no RESULTS to resume from: rerun with -o FILE (jobs already done"
            " hand back their stored results)"
        )
    if from_stdin:
        return (
            "stdin was read once and cannot be read again, so this run cannot resume"
            " itself: pipe the same lines again with the same -o (ids already there are"
            " skipped)"
        )
    return RERUN


def _interrupted(
    report: BatchReport, client: JobClient, cancel: bool, so_far: str, hint: str, err: Console
) -> None:
    """Ctrl-C: say what still runs, cancel it if asked, and exit 130. A second Ctrl-C
    stops the cancelling with a count (a third reaches run()'s handler: still one line)."""
    left = report.unanswered + report.maybe_submitted

    def say(text: str) -> None:
        err.print(text, markup=False, highlight=False, soft_wrap=True)

    if not cancel or not left:
        keep = f"{len(left)} submitted jobs have no result yet and keep running on the farm"
        tip = " (--cancel-on-interrupt cancels them)" if left else ""
        say(f"interrupted: {keep}{tip}; results so far {so_far}; {hint}")
        sys.exit(130)
    say(f"interrupted: cancelling {len(left)} submitted jobs without a result ...")
    cancelled = 0
    try:
        for job_id in left:
            cancelled += client.cancel(job_id)
    except KeyboardInterrupt:
        say(
            f"cancelling stopped: cancelled {cancelled} of {len(left)}; the others keep"
            f" running; results so far {so_far}"
        )
        sys.exit(130)
    say(
        f"cancelled {cancelled} jobs ({len(left) - cancelled} had already ended); results"
        f" so far {so_far}; a rerun records the cancelled ones as cancelled (a new"
        " --id-prefix runs everything again)"
    )
    sys.exit(130)


def _quiet_stdout() -> None:
    """stdout's reader is gone: point it at /dev/null so exiting does not raise again."""
    with contextlib.suppress(OSError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())

"""`sandfarm batch ...`: JSONL in, JSONL out, through the farm."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from producer.commands.local import fail


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
    type=click.Path(exists=True, dir_okay=False, readable=True, path_type=Path),
)
@click.option(
    "-o",
    "--output",
    required=True,
    type=click.Path(dir_okay=False, writable=True, path_type=Path),
    help="RESULTS.jsonl: one JobResult per line, appended; ids already there are skipped",
)
@click.option("--redis-url", envvar="SANDFARM_REDIS_URL", help="Redis URL [env SANDFARM_REDIS_URL]")
@click.option(
    "--timeout",
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
@click.option("--id-prefix", help="namespace for the ids derived for lines without an id")
@click.option(
    "--progress/--no-progress", default=None, help="progress bar on stderr (default: on a tty)"
)
def run(
    jobs: tuple[Path, ...],
    output: Path,
    redis_url: str | None,
    timeout: float | None,
    chunk: int,
    id_prefix: str | None,
    progress: bool | None,
) -> None:
    """Run every job of JOBS (JSONL, one JobSpec per line) and append results to -o.

    A line that is not a valid spec is reported on stderr and in RESULTS as
    {"line": N, "file": ..., "error": "<field>: <reason>"}; the valid lines still run.
    Exit 0 when every job has a result, whatever its status; 1 when the farm failed or
    --timeout passed first; 2 on bad usage.
    """
    from rich.console import Console

    from producer.batch import print_summary, run_batch

    resolved = output.resolve()
    if any(path.resolve() == resolved for path in jobs):
        fail(f"-o {output} is also an input file")
    if len({path.resolve() for path in jobs}) != len(jobs):
        fail("an input file is given twice")
    if len({path.name for path in jobs}) != len(jobs):
        fail("input files need distinct names: derived ids and error lines use the name")
    err = Console(stderr=True)
    if not err.is_terminal:  # a log file: room for the final progress line, unwrapped
        err = Console(stderr=True, width=max(err.width, 160))
    show = err.is_terminal if progress is None else progress
    try:
        from producer.client import FarmClient

        client = FarmClient(redis_url)
        try:
            report = run_batch(
                jobs,
                output,
                client,
                chunk=chunk,
                timeout=timeout,
                id_prefix=id_prefix,
                stderr=err,
                progress=show,
            )
        finally:
            close = getattr(client, "close", None)
            if close is not None:
                close()
    except KeyboardInterrupt:
        err.print(f"interrupted: results so far are in {output}; rerun to resume")
        sys.exit(130)
    except Exception as exc:  # the farm (Redis, the client) failed: one line, exit 1
        fail(f"batch failed: {type(exc).__name__}: {exc}", code=1)
    print_summary(report)
    if not report.completed:
        fail(f"{report.missing} jobs have no result yet; rerun to resume", code=1)

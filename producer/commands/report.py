"""`sandfarm report`: a RESULTS file as one HTML page people look at."""

from __future__ import annotations

from pathlib import Path

import click

from producer.commands.common import fail


def register(group: click.Group) -> None:
    group.add_command(report)


@click.command()
@click.argument(
    "results", type=click.Path(exists=True, dir_okay=False, readable=True, path_type=Path)
)
@click.option(
    "-o",
    "--output",
    required=True,
    type=click.Path(dir_okay=False, writable=True, path_type=Path),
    help="the HTML file to write (self-contained: plots inline, no script)",
)
@click.option(
    "--group-by",
    default="labels.task",
    show_default=True,
    help="labels.NAME: the task groups of the pass@k section",
)
def report(results: Path, output: Path, group_by: str) -> None:
    """Write RESULTS (JobResults, one per line: `batch run -o`, `eval`'s SAMPLES_farm.jsonl)
    as one HTML page: status mix, run-time and queue-wait histograms by backend, where the
    time goes, pass@k per task group, the slowest and the failing jobs. For an eval run's
    SAMPLES_farm.jsonl (its SAMPLES_farm.key beside it) passing is the harness's verdict."""
    from producer.batch.groups import label_of
    from producer.report import load, render
    from sandbox_core import SpecError

    try:
        label = label_of(group_by)
    except SpecError as exc:
        fail(str(exc))
    from producer.eval.run import verdicts_for

    if output.resolve() == results.resolve():  # it would replace the results (a review)
        fail(f"-o {output} is the RESULTS file it reads: name another")
    data = load(results, label, verdicts_for(results))
    if not data.jobs:
        fail(f"{results}: no job results in it (one JobResult JSON per line)")
    output.write_text(render(data), encoding="utf-8")
    click.echo(f"{output}: {data.jobs} jobs")

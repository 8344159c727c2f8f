"""Job commands (submit, result, cancel, status): what the SDK does, from the shell.

Each checks first that Redis answers (one line and exit 1 within seconds if not); bad
input exits 2 naming the field; a reused id for a different job exits 2 naming the id.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import click

from producer.commands.common import fail, job_client, reachable_settings
from producer.commands.local import limit_options, print_result, spec_from_options
from producer.protocol import FarmError, IdConflictError
from sandbox_core import BACKEND_NAMES, SpecError, parse_spec

if TYPE_CHECKING:
    from producer.jobclient import JobClient

redis_url_option = click.option(
    "--redis-url", envvar="SANDFARM_REDIS_URL", help="Redis URL [env SANDFARM_REDIS_URL]"
)
wait_timeout_option = click.option(
    "--wait-timeout", type=float, default=None, help="give up waiting after S seconds (exit 1)"
)


def register(group: click.Group) -> None:
    for command in (submit, result, cancel, status):
        group.add_command(command)


api_option = click.option(
    "--api", envvar="SANDFARM_API", help="a gateway URL: act as its tenant (SANDFARM_API_KEY)"
)


def _client(redis_url: str | None, api: str | None = None) -> JobClient:
    return job_client(redis_url, api)


@contextlib.contextmanager
def _closing(client: JobClient) -> Iterator[JobClient]:
    try:
        yield client
    finally:
        client.close()


def _notice(message: str) -> None:
    click.echo(f"sandfarm: {message}", err=True)


@click.command()
@click.option("--backend", type=click.Choice(BACKEND_NAMES), help="default: the worker's")
@click.option("--code", help="Python code to run (one python step)")
@click.option("--command", help="shell command to run (one bash step)")
@click.option("--job", help="a JobSpec JSON file, or - for stdin")
@click.option("--id", "job_id", help="idempotency key: the same id and spec run once")
@limit_options
@click.option("--wait", is_flag=True, help="wait for the result and print it")
@wait_timeout_option
@click.option("--json", "as_json", is_flag=True, help="print JSON (the id, or the JobResult)")
@redis_url_option
@api_option
def submit(
    backend: str | None,
    code: str | None,
    command: str | None,
    job: str | None,
    job_id: str | None,
    timeout_s: float | None,
    memory_mb: int | None,
    network: bool | None,
    wait: bool,
    wait_timeout: float | None,
    as_json: bool,
    redis_url: str | None,
    api: str | None,
) -> None:
    """Submit one job to the farm; print its id, or with --wait its result."""
    spec = spec_from_options(
        code,
        command,
        job,
        {"timeout_s": timeout_s, "memory_mb": memory_mb, "network": network},
        backend=backend,
    )
    if job_id:
        try:  # validated like any spec field (charset, length)
            spec = parse_spec({**spec.model_dump(mode="json", exclude_none=True), "id": job_id})
        except SpecError as exc:
            fail(str(exc))
    client = _client(redis_url, api)
    try:
        try:
            submitted = client.submit(spec)
        except IdConflictError as exc:
            fail(str(exc))
        except FarmError as exc:  # over a quota, the key refused, the gateway away
            fail(str(exc), 1)
        if not wait:
            click.echo(json.dumps({"id": submitted}) if as_json else submitted)
            return
        _wait_and_print(client, submitted, wait_timeout, as_json)
    finally:
        client.close()


def _wait_and_print(
    client: JobClient, job_id: str, wait_timeout: float | None, as_json: bool
) -> None:
    try:
        waiting = client.as_completed([job_id], timeout=wait_timeout, notice=_notice)
        found = next(waiting)
    except TimeoutError as exc:
        fail(f"job {job_id}: {exc}", code=1)
    print_result(found, as_json)


@click.command()
@click.argument("job_id")
@click.option("--wait", is_flag=True, help="wait until the job is final")
@wait_timeout_option
@click.option("--json", "as_json", is_flag=True, help="print the JobResult (or the state) as JSON")
@redis_url_option
@api_option
def result(
    job_id: str,
    wait: bool,
    wait_timeout: float | None,
    as_json: bool,
    redis_url: str | None,
    api: str | None,
) -> None:
    """Print a job's result; without --wait, its state if it is not final yet.

    Exit 0 with a result or a state, 1 if the job is unknown (or its result expired).
    """
    with _closing(_client(redis_url, api)) as client:
        state = client.state(job_id)
        if state == "unknown":
            fail(f"job {job_id} is unknown here (never submitted, or its result expired)", 1)
        if wait or state not in ("queued", "running"):
            _wait_and_print(client, job_id, wait_timeout, as_json)
            return
        click.echo(json.dumps({"id": job_id, "status": state}) if as_json else state)


@click.command()
@click.argument("job_ids", nargs=-1)
@click.option(
    "--from",
    "inputs",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="cancel every job of this batch input file (as `batch run` named them)",
)
@click.option("--id-prefix", help="the --id-prefix the batch ran with")
@click.option("--backend", "default_backend", help="the batch's --backend default")
@click.option("--timeout", "default_timeout", type=float, help="the batch's --timeout default")
@click.option("--memory-mb", "default_memory", type=int, help="the batch's --memory-mb default")
@redis_url_option
@api_option
def cancel(
    job_ids: tuple[str, ...],
    inputs: tuple[Path, ...],
    id_prefix: str | None,
    default_backend: str | None,
    default_timeout: float | None,
    default_memory: int | None,
    redis_url: str | None,
    api: str | None,
) -> None:
    """Cancel jobs: a queued one ends `cancelled` without running, a running one is stopped.

    With --from, the batch's ids are those `batch run` gave its lines: give the same
    --id-prefix and defaults it ran with. Prints how many were cancelled, and how many
    were already final or unknown.
    """
    from producer.batch import job_ids_of
    from producer.batch.lines import Defaults

    defaults = Defaults(default_backend, default_timeout, default_memory)
    ids = list(job_ids) + [
        job_id for path in inputs for job_id in job_ids_of(path, id_prefix, defaults)
    ]
    if not ids:
        fail("give job ids, or --from a batch input file")
    with _closing(_client(redis_url, api)) as client:
        cancelled = sum(client.cancel(job_id) for job_id in ids)
    click.echo(f"cancelled {cancelled}; {len(ids) - cancelled} already final or unknown")


@click.command()
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@redis_url_option
def status(as_json: bool, redis_url: str | None) -> None:
    """Queue depth, the workers online (queues, backends, slots, last beat), jobs in flight,
    and each tenant's waiting and dispatched jobs."""
    from producer.client import FarmClient

    with FarmClient(settings=reachable_settings(redis_url=redis_url)) as client:
        info = client.status()
    if as_json:
        click.echo(json.dumps(info, indent=2))
        return
    click.echo(
        f"queue {info['queue']}: {info['queued']} queued, {info['delivered_unacked']} delivered,"
        f" {info['in_flight']} running; {info['duplicates']} duplicate results dropped"
    )
    click.echo(f"workers online: {info['workers_online']}")
    for w in info["workers"]:
        lo, hi = w["slots"]
        click.echo(
            f"  {w['name']:<32} queues {','.join(w['queues']) or '-'}"
            f"  backends {','.join(w['backends']) or '-'}  slots {lo}..{hi - 1}"
            f"  beat {w['age_s']}s ago"
        )
    for name, counts in info["tenants"].items():
        today = counts["today"]
        click.echo(
            f"tenant {name}: {counts['waiting']} waiting, {counts['dispatched']} dispatched;"
            f" today {today.get('jobs', 0):.0f} jobs, {today.get('cpu_ms', 0) / 1000:.1f} CPU-s,"
            f" {today.get('wall_ms', 0) / 1000:.1f} wall-s, {today.get('bytes', 0):.0f} bytes"
        )

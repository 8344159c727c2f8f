"""Farm commands (worker, submit, status, flower): they talk to Redis/Celery.

`worker` and `flower` replace this process with Celery's own (exec), so signals reach
Celery directly; the producer side never imports worker code.
"""

from __future__ import annotations

import json
import os
import sys

import click

from producer.commands.local import fail, limit_options, print_result, spec_from_options
from producer.protocol import Settings
from sandbox_core import BACKEND_NAMES, SpecError, parse_spec


def _default(name: str) -> str:
    """``[default: X]`` for help texts, from the settings model (env var named too)."""
    return f"[default: SANDFARM_{name.upper()}, else {Settings.default_of(name)}]"


redis_url_option = click.option(
    "--redis-url", envvar="SANDFARM_REDIS_URL", help="Redis URL [env SANDFARM_REDIS_URL]"
)


def register(group: click.Group) -> None:
    """Add the farm commands to the `sandfarm` group."""
    group.add_command(worker)
    group.add_command(submit)
    group.add_command(status)
    group.add_command(flower)
    group.add_command(settings_command)


def _exec_celery(args: list[str], env: dict[str, str]) -> None:
    argv = [sys.executable, "-m", "celery", *args]
    os.execvpe(argv[0], argv, {**os.environ, **env})


@click.command()
@click.option(
    "--backend",
    type=click.Choice(BACKEND_NAMES),
    help=f"backend of jobs that name none {_default('default_backend')}",
)
@click.option(
    "--concurrency", "-c", type=int, default=None, help=f"sandbox slots {_default('concurrency')}"
)
@click.option("--name", "-n", help="node name (NAME@host); distinct per worker on a host")
@click.option("--queue", "-Q", help=f"queue to consume {_default('queue')}")
@click.option("--loglevel", "-l", default="info", show_default=True)
@click.option("--allow-weaker", is_flag=True, help="run jobs even if a protection is missing")
@redis_url_option
def worker(
    backend: str | None,
    concurrency: int | None,
    name: str | None,
    queue: str | None,
    loglevel: str,
    allow_weaker: bool,
    redis_url: str | None,
) -> None:
    """Start a sandbox worker (Celery prefork, one slot per pool process, events on)."""
    from producer.protocol import get_settings

    settings = get_settings(redis_url=redis_url, concurrency=concurrency, queue=queue)
    env = {
        "SANDFARM_REDIS_URL": settings.redis_url,
        "SANDFARM_DEFAULT_BACKEND": backend or settings.default_backend,
        "SANDFARM_CONCURRENCY": str(settings.concurrency),
        "SANDFARM_QUEUE": settings.queue,
    }
    if allow_weaker:
        env["SANDFARM_ALLOW_WEAKER"] = "1"
    args = [
        "-A",
        "worker.app",
        "worker",
        "-P",
        "prefork",
        "-c",
        str(settings.concurrency),
        "-O",
        "fair",  # a free pool process takes the next job; none waits behind a long one
        "-Q",
        settings.queue,
        "-l",
        loglevel,
        "--without-gossip",  # workers need not watch each other; less event traffic
        "--without-mingle",  # no revoked-task sync at start: we cancel through Redis keys
    ]
    if settings.task_events:
        args.append("-E")  # task events, for Flower
    if name:
        args += ["-n", name if "@" in name else f"{name}@%h"]
    _exec_celery(args, env)


@click.command()
@click.option("--backend", type=click.Choice(BACKEND_NAMES), help="default: the worker's")
@click.option("--code", help="Python code to run (one python step)")
@click.option("--command", help="shell command to run (one bash step)")
@click.option("--job", help="a JobSpec JSON file, or - for stdin")
@click.option("--id", "job_id", help="idempotency key: the same id runs once")
@limit_options
@click.option("--wait", is_flag=True, help="wait for the result and print it")
@click.option("--wait-timeout", type=float, default=None, help="give up waiting after S seconds")
@click.option("--json", "as_json", is_flag=True, help="print JSON (the id, or the JobResult)")
@redis_url_option
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
) -> None:
    """Submit one job to the farm; print its id, or with --wait its result."""
    from producer.client import FarmClient

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
    with FarmClient(redis_url) as client:
        try:
            submitted = client.submit(spec)
        except Exception as exc:
            fail(f"could not submit: {exc}", code=1)
        if not wait:
            click.echo(json.dumps({"id": submitted}) if as_json else submitted)
            return
        try:
            result = next(client.as_completed([submitted], timeout=wait_timeout))
        except TimeoutError:
            fail(f"job {submitted} not finished after {wait_timeout}s", code=1)
        print_result(result, as_json)


@click.command()
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@redis_url_option
def status(as_json: bool, redis_url: str | None) -> None:
    """Queue depth, workers online, jobs in flight."""
    from producer.client import FarmClient

    with FarmClient(redis_url) as client:
        try:
            info = client.status()
        except Exception as exc:
            fail(f"farm unreachable at {client.settings.redis_url}: {exc}", code=1)
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
            f"  {w['name']:<32} pid {w['pid']:<7} slots {lo}..{hi - 1}  beat {w['age_s']}s ago"
        )


@click.command()
@click.option("--port", type=int, default=None, help=f"HTTP port {_default('flower_port')}")
@click.option("--address", default="127.0.0.1", show_default=True)
@click.option(
    "--api", is_flag=True, help="serve Flower's HTTP API without auth (keep --address local)"
)
@redis_url_option
def flower(port: int | None, address: str, api: bool, redis_url: str | None) -> None:
    """Start Flower on the farm's broker (workers and tasks, with short summaries).

    Same as: SANDFARM_REDIS_URL=... celery -A producer.celery_app flower --port=5555
    """
    from producer.protocol import get_settings

    settings = get_settings(redis_url=redis_url)
    env = {"SANDFARM_REDIS_URL": settings.redis_url}
    if api:
        env["FLOWER_UNAUTHENTICATED_API"] = "true"
    port = port or settings.flower_port
    _exec_celery(
        ["-A", "producer.celery_app", "flower", f"--port={port}", f"--address={address}"], env
    )


@click.command("settings")
@click.option("--markdown", is_flag=True, help="the table of every setting, as in the README")
def settings_command(markdown: bool) -> None:
    """Every farm setting: its environment variable, its value here, what it means."""
    from producer.protocol import get_settings

    if markdown:
        click.echo(Settings.table())
        return
    current = get_settings()
    for name, field in Settings.model_fields.items():
        value = getattr(current, name)
        click.echo(f"SANDFARM_{name.upper()}={'' if value is None else value}")
        click.echo(f"    {field.description}")

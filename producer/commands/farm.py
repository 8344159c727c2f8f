"""Farm process commands (worker, flower, settings).

`worker` and `flower` replace this process with Celery's own (exec), so signals reach
Celery directly; the producer side never imports worker code.
"""

from __future__ import annotations

import os
import sys

import click

from producer.commands.common import fail, farm_settings, reachable_settings
from producer.protocol import FarmError, Settings
from producer.protocol.connection import redact
from sandbox_core import BACKEND_NAMES


def _default(name: str) -> str:
    """``[default: X]`` for help texts, from the settings model (env var named too)."""
    return f"[default: SANDFARM_{name.upper()}, else {Settings.default_of(name)}]"


redis_url_option = click.option(
    "--redis-url", envvar="SANDFARM_REDIS_URL", help="Redis URL [env SANDFARM_REDIS_URL]"
)


FLOWER_COLUMNS = "name,uuid,result,args,state,received,runtime,worker"


def register(group: click.Group) -> None:
    """Add the farm commands to the `sandfarm` group."""
    group.add_command(worker)
    group.add_command(flower)
    group.add_command(metrics)
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
@click.option(
    "--backends",
    help=f"backends it serves, comma-separated; others are rejected {_default('backends')}",
)
@click.option("--loglevel", "-l", default="info", show_default=True)
@click.option("--allow-weaker", is_flag=True, help="run jobs even if a protection is missing")
@redis_url_option
def worker(
    backend: str | None,
    concurrency: int | None,
    name: str | None,
    queue: str | None,
    backends: str | None,
    loglevel: str,
    allow_weaker: bool,
    redis_url: str | None,
) -> None:
    """Start a sandbox worker (Celery prefork, one slot per pool process, events on).

    Each pool process runs every backend the worker serves in its one slot."""
    settings = reachable_settings(
        redis_url=redis_url,
        concurrency=concurrency,
        queue=queue,
        default_backend=backend,
        backends=backends,
    )
    env = {
        "SANDFARM_REDIS_URL": settings.redis_url,
        "SANDFARM_DEFAULT_BACKEND": settings.default_backend,
        "SANDFARM_BACKENDS": ",".join(settings.served_backends),
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
    settings = reachable_settings(redis_url=redis_url)
    env = {"SANDFARM_REDIS_URL": settings.redis_url}
    if api:
        env["FLOWER_UNAUTHENTICATED_API"] = "true"
    port = port or settings.flower_port
    _exec_celery(
        [
            "-A",
            "producer.celery_app",
            "flower",
            f"--port={port}",
            f"--address={address}",
            # the job's status, exit code, duration and backend (the task's result) and its
            # code-free summary (args) next to Celery's own state, which is SUCCESS whenever
            # the task returned
            f"--tasks_columns={FLOWER_COLUMNS}",
        ],
        env,
    )


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="address to listen on")
@click.option("--port", type=int, default=None, help=f"HTTP port {_default('metrics_port')}")
@redis_url_option
def metrics(host: str, port: int | None, redis_url: str | None) -> None:
    """Serve the farm's Prometheus metrics at /metrics, read from Redis at each scrape.

    One collector serves the whole farm (run one, or one per Prometheus). It starts
    without Redis too: then it reports sandfarm_redis_up 0."""
    from producer.metrics import serve

    settings = farm_settings(redis_url=redis_url)
    try:
        serve(settings, host, port or settings.metrics_port)
    except FarmError:
        raise  # its own one line (the CLI's group prints it)
    except OSError as exc:  # the address is taken or not ours
        fail(f"--host {host} --port {port or settings.metrics_port}: {exc.strerror}", 1)


@click.command("settings")
@click.option("--markdown", is_flag=True, help="the table of every setting, as in the README")
def settings_command(markdown: bool) -> None:
    """Every farm setting: its environment variable, its value here, what it means."""
    if markdown:
        click.echo(Settings.table())
        return
    current = farm_settings()
    for name, field in Settings.model_fields.items():
        value = getattr(current, name)
        if name == "metrics_token" and value:
            value = "***"  # a secret, like the password in the Redis URL
        elif name == "redis_url":
            value = redact(value)
        click.echo(f"SANDFARM_{name.upper()}={'' if value is None else value}")
        click.echo(f"    {field.description}")

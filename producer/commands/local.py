"""Commands that need no farm: schema, doctor, run (sandbox_core directly)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from producer.commands.common import fail
from producer.terminal import MESSAGE_PREFIX, columns_of, terminal_rows, terminal_safe
from sandbox_core import BACKEND_NAMES, JobResult, JobSpec, SpecError, get_backend, parse_spec
from sandbox_core.errors import BackendUnavailableError

# A job's sources and seeded files are bounded (sandbox_core.defaults); so is its file.
MAX_JOB_FILE_BYTES = 16 * 1024 * 1024


def spec_from_options(
    code: str | None,
    command: str | None,
    job: str | None,
    overrides: dict[str, object],
    backend: str | None = None,
) -> JobSpec:
    """Build and validate a spec from --code/--command/--job plus limit overrides."""
    given = [
        name for name, value in (("--code", code), ("--command", command), ("--job", job)) if value
    ]
    if len(given) != 1:
        fail("give exactly one of --code, --command or --job")
    if job:
        try:
            if job == "-":
                text = sys.stdin.read(MAX_JOB_FILE_BYTES + 1)
            else:
                with Path(job).open(encoding="utf-8") as fh:
                    text = fh.read(MAX_JOB_FILE_BYTES + 1)
            if len(text) > MAX_JOB_FILE_BYTES:
                fail(f"--job {job}: larger than {MAX_JOB_FILE_BYTES} bytes")
            data = json.loads(text)
        except (OSError, ValueError, RecursionError) as exc:
            fail(f"--job {job}: {type(exc).__name__}: {str(exc)[:200]}")
        if not isinstance(data, dict):
            fail(f"--job {job}: a job is a JSON object")
    else:
        data = {"code": code} if code else {"command": command}
    limits = {k: v for k, v in overrides.items() if v is not None}
    if limits:
        data["limits"] = {**(data.get("limits") or {}), **limits}
    if backend and not data.get("backend"):
        data["backend"] = backend
    try:
        return parse_spec(data)
    except SpecError as exc:
        fail(str(exc))


def print_result(result: JobResult, as_json: bool) -> None:
    if as_json:
        click.echo(result.model_dump_json())
        return
    out_tty, err_tty = sys.stdout.isatty(), sys.stderr.isatty()
    err_cols = columns_of(sys.stderr)
    for index, step in enumerate(result.steps):
        head = f"--- step {index} {step.kind}: {step.status.value}"
        extra = f" exit={step.exit_code}" if step.exit_code is not None else ""
        extra += f" signal={step.signal}" if step.signal else ""
        click.echo(f"{head}{extra} ({step.duration_ms:.0f} ms)", err=True)
        # color=True: piped, the job's bytes pass as written (click would strip ANSI)
        if step.stdout:
            stdout = terminal_safe(step.stdout, out_tty, columns_of(sys.stdout))
            click.echo(stdout, nl=not stdout.endswith("\n"), color=True)
        if step.stderr:
            stderr = terminal_safe(step.stderr, err_tty, columns_of(sys.stderr))
            click.echo(stderr, nl=not stderr.endswith("\n"), err=True, color=True)
        if step.message:  # it may quote the spec: a path of newlines, or 80 columns
            shown = terminal_rows(step.message, err_tty, MESSAGE_PREFIX, columns=err_cols)
            click.echo(shown if err_tty else f"{MESSAGE_PREFIX}{step.message}", err=True)
    tail = f": {result.message}" if result.message else ""
    # the status line is the CLI's: its own row at column 0, the message's rows indented
    status = f"=== {result.status.value}{tail}"
    click.echo(terminal_rows(status, err_tty, MESSAGE_PREFIX, "", err_cols), err=True)


def limit_options(func):
    func = click.option("--network/--no-network", default=None, help="allow network")(func)
    func = click.option("--memory-mb", type=int, help="memory limit in MB")(func)
    func = click.option("--timeout", "timeout_s", type=float, help="wall timeout in seconds")(func)
    return func


def register(group: click.Group) -> None:
    group.add_command(schema)
    group.add_command(doctor)
    group.add_command(run)


@click.command()
@click.option("--result", is_flag=True, help="the JobResult schema instead of JobSpec")
def schema(result: bool) -> None:
    """Print the JSON Schema of a job (or of a result)."""
    model = JobResult if result else JobSpec
    click.echo(json.dumps(model.model_json_schema(), indent=2))


@click.command()
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@click.option("--redis-url", envvar="SANDFARM_REDIS_URL", help="Redis URL [env SANDFARM_REDIS_URL]")
def doctor(as_json: bool, redis_url: str | None) -> None:
    """Show which protections each backend really gives on this host, and why not."""
    from producer.protocol import get_settings

    settings = get_settings()
    if redis_url:
        settings = settings.model_copy(update={"redis_url": redis_url})
    report: dict[str, str | list[dict[str, object]]] = {}
    for name in BACKEND_NAMES:
        try:
            backend = get_backend(settings.backend_config(name))
            try:
                backend.ensure_available()  # one line for a missing engine, not one per row
                report[name] = [p.__dict__ for p in backend.protections()]
            finally:
                backend.close()
        except (ImportError, BackendUnavailableError, OSError) as exc:
            report[name] = f"unavailable: {exc}"
    report["farm"] = _farm_checks(settings.redis_url)
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    for name, items in report.items():
        click.echo(f"{name}:")
        if isinstance(items, str):
            click.echo(f"  {items}")
            continue
        for item in items:
            mark = "yes" if item["active"] else "NO "
            click.echo(f"  [{mark}] {item['name']:<22} {item['detail']}")


def _farm_checks(redis_url: str) -> list[dict[str, object]]:
    """What the farm's own parts give: a Redis that asks for a password, and one whose
    memory is bounded without eviction; all jobs' memory bounded below the host's RAM."""
    from producer.protocol.connection import auth_problem, redact

    problem = auth_problem(redis_url)
    detail = problem or f"{redact(redis_url)} asks for credentials (or is not reachable)"
    return [
        {"name": "redis password", "active": problem is None, "detail": detail},
        *_server_checks(redis_url),
        _jobs_memory_row(),
        _waiting_connections_row(),
        _task_tables_row(),
    ]


TASKS_ROW = "host task tables"


def _task_tables_row() -> dict[str, object]:
    """How many jobs at the most processes the host's pid and thread tables hold at once
    (sandbox_core/tasklimits.py): past that, no process on the host can fork."""
    from sandbox_core import defaults as d
    from sandbox_core.tasklimits import PID_MAX_TARGET, jobs_at_most_processes, pid_max

    fits, current = jobs_at_most_processes(), pid_max()
    detail = (
        f"kernel.pid_max {current}, threads-max as the RAM allows: {fits} jobs at the most"
        f" processes ({d.PROCESSES[1]}) fit at once"
    )
    if current is not None and current < PID_MAX_TARGET:
        detail += f"; a worker started as root raises pid_max to {PID_MAX_TARGET}"
    # a worker's slots by default: one a CPU, two lanes (a review: pid_max alone read
    # green where threads-max, at 4 GiB of RAM, held six such jobs)
    slots = 2 * (os.cpu_count() or 1)
    if fits is not None and fits < slots:
        detail += f"; fewer than a worker's {slots} default slots: lower limits.processes caps"
    active = current is not None and current >= PID_MAX_TARGET and (fits or 0) >= slots
    return {"name": TASKS_ROW, "active": active, "detail": detail}


WAITING_ROW = "tcp clients waiting"


def _waiting_connections_row() -> dict[str, object]:
    """How many connections a job may keep waiting to be accepted (sandbox_core/tcpwatch.py):
    each counts at twice the host's rmem_max, so a large one stops ordinary servers."""
    from sandbox_core import defaults as d
    from sandbox_core.tcpwatch import most_one_connection_holds

    fits = d.WAITING_CONNECTIONS_BYTES // most_one_connection_holds()
    detail = (
        f"a job may keep {fits} connections waiting to be accepted, each counted at what"
        f" it may hold ({most_one_connection_holds() // 1024} KiB: twice"
        " net.core.rmem_max, and a packet)"
    )
    if fits < 64:
        detail += (
            "; the kernel's default allows 273: sysctl -w net.core.rmem_max=212992"
            " (before the workers start: each job's namespace copies it)"
        )
    return {"name": WAITING_ROW, "active": fits >= 64, "detail": detail}


def _jobs_memory_row() -> dict[str, object]:
    """The limit of the parent memory cgroup of all jobs (cgroups.farm_memory_limit): each
    job's memory_mb and workspace_mb fit the host, not all of them at once. As this
    process's cgroup gets it: a worker's jobs nest under its own, bounded alike."""
    from sandbox_core import cgroups

    layout = cgroups.detect()
    bound, total = layout.memory_bound, cgroups.mem_total() or 0
    if bound is None:
        why = "; ".join(layout.problems) or "no memory cgroup"
        detail = f"jobs together may take all the host's RAM, a host-wide OOM: {why}"
    else:
        detail = (
            f"jobs together at most {bound // 2**20} MiB of the host's {total // 2**20} MiB"
            f" ({layout.memory}): an overcommitted farm OOMs in its own group"
        )
    return {"name": "jobs' memory bound", "active": bound is not None, "detail": detail}


MEMORY_ROW = "redis maxmemory"


def _server_checks(redis_url: str) -> list[dict[str, object]]:
    """Its version (the scripts declare their flags as Redis 7 reads them) and its memory
    bound: tenants' quotas bound each one's bytes in Redis, not the sum: a Redis with no
    maxmemory grows until the host's OOM killer ends it, and one that evicts when full
    drops queued jobs and results without a word (noeviction refuses writes instead)."""
    import redis

    from producer.protocol.connection import connect

    try:
        client = connect(redis_url, patient=False)
        try:
            config = {str(k): str(v) for k, v in client.config_get("maxmemory*").items()}
            version = str(client.info("server").get("redis_version", "0"))
        finally:
            client.close()
    except (redis.RedisError, ValueError) as exc:
        return [{"name": MEMORY_ROW, "active": False, "detail": f"not known (CONFIG GET: {exc})"}]
    first = version.split(".")[0]
    major = int(first) if first.isdigit() else 0
    version_row = {
        "name": "redis version",
        "active": major >= 7,
        "detail": f"Redis {version}"
        + ("" if major >= 7 else ": the farm needs 7.0 or newer (its scripts' #!lua flags)"),
    }
    return [version_row, _memory_row(redis_url, config)]


def _memory_row(redis_url: str, config: dict[str, str]) -> dict[str, object]:
    from producer.protocol.connection import redact

    limit, policy = int(config.get("maxmemory", "0")), config.get("maxmemory-policy", "")
    fix = "ops/start_redis.sh sets both: SANDFARM_REDIS_MAXMEMORY"
    if limit == 0:
        detail = (
            f"Redis at {redact(redis_url)} has no maxmemory: it grows until the host runs"
            f" out of memory; set maxmemory with maxmemory-policy noeviction ({fix})"
        )
    elif policy != "noeviction":
        detail = (
            f"maxmemory {limit // 2**20} MiB with maxmemory-policy {policy}: when full, keys"
            f" (queued jobs, results) vanish without a word; set noeviction ({fix})"
        )
    else:
        detail = f"maxmemory {limit // 2**20} MiB, noeviction: when full, writes are refused"
    return {"name": MEMORY_ROW, "active": limit > 0 and policy == "noeviction", "detail": detail}


@click.command()
@click.option("--backend", type=click.Choice(BACKEND_NAMES), default="process", show_default=True)
@click.option("--code", help="Python code to run (one python step)")
@click.option("--command", help="shell command to run (one bash step)")
@click.option("--job", help="a JobSpec JSON file, or - for stdin")
@limit_options
@click.option("--allow-weaker", is_flag=True, help="run even where a protection is missing")
@click.option("--json", "as_json", is_flag=True, help="print exactly one JobResult JSON document")
def run(
    backend: str,
    code: str | None,
    command: str | None,
    job: str | None,
    timeout_s: float | None,
    memory_mb: int | None,
    network: bool | None,
    allow_weaker: bool,
    as_json: bool,
) -> None:
    """Run one job locally, no queue. Exit 0 whenever a result was produced."""
    spec = spec_from_options(
        code, command, job, {"timeout_s": timeout_s, "memory_mb": memory_mb, "network": network}
    )
    from producer.protocol import get_settings

    settings = get_settings()
    name = spec.backend or backend
    try:
        # The operator asked for --network on this command line: allow it for this run.
        config = settings.backend_config(name)
        if hasattr(config, "prewarm"):  # one job: no next one to set a sandbox up for
            config = config.model_copy(update={"prewarm": False})
        sandbox = get_backend(
            config,
            allow_weaker=allow_weaker or settings.allow_weaker,
            allow_network=bool(network) or settings.allow_network,
        )
    except (BackendUnavailableError, ImportError) as exc:
        fail(f"backend {name}: {exc}", code=1)
    try:
        sandbox.ensure_available()
        result = sandbox.run(spec)
    except BackendUnavailableError as exc:
        fail(f"backend {name}: {exc}", code=1)
    finally:
        sandbox.close()  # nothing of the job (a container) outlives the command
    print_result(result, as_json)

"""`sandfarm tenant ...` (the teams sharing the farm, their policies and API keys) and
`sandfarm gateway` (their HTTP API). Operator commands: they talk to Redis directly."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import redis

from producer.commands.common import fail, reachable_settings, redis_failure
from producer.protocol import FarmScripts, TenantError, TenantsFileError, connect, tenant_backup
from producer.protocol.tenant_store import TenantStore, text
from producer.protocol.tenants import (
    CAPPABLE,
    DEFAULT_MAX_QUEUED,
    DEFAULT_MAX_QUEUED_MB,
    DEFAULT_RESULT_MB_PER_DAY,
    Policy,
)

redis_url_option = click.option(
    "--redis-url", envvar="SANDFARM_REDIS_URL", help="Redis URL [env SANDFARM_REDIS_URL]"
)
_CAP_FLAGS = {
    "timeout_s": "--max-timeout",
    "memory_mb": "--max-memory-mb",
    "cpu_s": "--max-cpu-s",
    "cpus": "--max-cpus",
    "processes": "--max-processes",
    "open_files": "--max-open-files",
    "file_size_mb": "--max-file-size-mb",
    "output_bytes": "--max-output-bytes",
    "flood_kill_bytes": "--max-flood-kill-bytes",
    "workspace_mb": "--max-workspace-mb",
    "ptys": "--max-ptys",
}
assert set(_CAP_FLAGS) == set(CAPPABLE)


def register(group: click.Group) -> None:
    group.add_command(tenant)
    group.add_command(gateway)


def policy_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """The policy flags, shared by `tenant add` and `tenant set` (unset: unchanged)."""
    for name, flag in reversed(_CAP_FLAGS.items()):
        func = click.option(flag, f"cap_{name}", type=float, help=f"cap of limits.{name}")(func)
    options = [
        click.option(
            "--weight", type=float, help="fair share against other tenants (a new tenant: 1)"
        ),
        click.option(
            "--max-running", type=int, help="jobs dispatched at once (a new tenant: no cap)"
        ),
        click.option(
            "--max-queued",
            type=int,
            help=f"jobs waiting at once (a new tenant: {DEFAULT_MAX_QUEUED})",
        ),
        click.option(
            "--max-queued-mb",
            type=int,
            help=f"MiB the jobs waiting may hold (a new tenant: {DEFAULT_MAX_QUEUED_MB})",
        ),
        click.option("--rate", type=float, help="submissions per second (a new tenant: no limit)"),
        click.option("--burst", type=int, help="rate bucket size (a new tenant: 2 s of rate)"),
        click.option("--backends", help="allowed backends, comma-separated (a new tenant: all)"),
        click.option("--images", help="allowed docker images, comma-separated (a new tenant: any)"),
        click.option("--network/--no-network", default=None, help="may ask for network"),
        click.option("--result-ttl", "result_ttl_s", type=int, help="result lifetime, seconds"),
        click.option(
            "--cpu-budget-s-per-day", type=float, help="CPU seconds a day (a new tenant: none)"
        ),
        click.option(
            "--result-mb-per-day",
            type=int,
            help=f"MiB results keep a day (a new tenant: {DEFAULT_RESULT_MB_PER_DAY})",
        ),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def _changes(options: dict[str, Any]) -> dict[str, Any]:
    changes: dict[str, Any] = {}
    caps = {k[4:]: v for k, v in options.items() if k.startswith("cap_") and v is not None}
    if caps:
        changes["caps"] = caps
    for name, value in options.items():
        if name.startswith("cap_") or value is None:
            continue
        if name in ("backends", "images"):
            value = [v.strip() for v in value.split(",") if v.strip()]
        changes[name] = value
    return changes


def _store(redis_url: str | None) -> tuple[TenantStore, FarmScripts]:
    settings = reachable_settings(redis_url=redis_url)
    client = connect(settings.redis_url)
    return TenantStore(client, settings.keys), FarmScripts(client, settings)


@click.group()
def tenant() -> None:
    """The teams sharing the farm: policies (quotas, caps, fair share) and API keys."""


@tenant.command("add")
@click.argument("name")
@policy_options
@redis_url_option
def add(name: str, redis_url: str | None, **options: Any) -> None:
    """Add a tenant with a policy (unset flags: the defaults in brackets)."""
    store, _ = _store(redis_url)
    try:
        policy = Policy.model_validate(_changes(options))
        store.add(name, policy)
    except (TenantError, ValueError) as exc:
        fail(str(exc).splitlines()[-1] if "validation error" in str(exc) else str(exc))
    click.echo(f"tenant {name} added; hand out a key: sandfarm tenant key create {name}")


@tenant.command("set")
@click.argument("name")
@policy_options
@redis_url_option
def set_(name: str, redis_url: str | None, **options: Any) -> None:
    """Change a tenant's policy (only the flags given); takes effect at once."""
    store, _ = _store(redis_url)
    changes = _changes(options)
    try:
        if "caps" in changes:
            changes["caps"] = {**store.policy(name).caps, **changes["caps"]}
        policy = store.update(name, **changes)
    except TenantError as exc:
        fail(str(exc))
    click.echo(json.dumps(policy.model_dump(mode="json"), indent=2))


@tenant.command("list")
@redis_url_option
def list_(redis_url: str | None) -> None:
    """Every tenant, with its weight and caps on running and waiting jobs."""
    store, _ = _store(redis_url)
    for name in store.names():
        policy = store.policy(name)
        click.echo(
            f"{name:<32} weight {policy.weight:g}  max_running {policy.max_running or '-'}"
            f"  max_queued {policy.max_queued} ({policy.max_queued_mb} MiB)"
            f"  keys {len(store.key_ids(name))}"
        )


@tenant.command("show")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True)
@redis_url_option
def show(name: str, as_json: bool, redis_url: str | None) -> None:
    """A tenant's policy, keys (never the tokens) and usage today."""
    from producer.farm_status import farm_status
    from producer.protocol import get_settings
    from producer.protocol.scripts import utc_day

    store, _ = _store(redis_url)
    try:
        policy = store.policy(name)
    except TenantError as exc:
        fail(str(exc), 1)
    settings = get_settings(redis_url=redis_url)
    raw = store.redis.hgetall(settings.keys.usage(name, utc_day()))
    usage = {text(k): float(v) for k, v in raw.items()}
    counts = farm_status(store.redis, settings)["tenants"].get(name, {})
    info = {
        "tenant": name,
        "policy": policy.model_dump(mode="json"),
        "keys": [k.model_dump(mode="json", exclude={"digest"}) for k in store.keys_of(name)],
        "queue": counts,
        "usage_today": usage,
    }
    click.echo(json.dumps(info, indent=2 if as_json else 1))


@tenant.command("remove")
@click.argument("name")
@click.option("--yes", is_flag=True, help="do not ask")
@click.option("--purge", is_flag=True, help="delete its job records and results too")
@redis_url_option
def remove(name: str, yes: bool, purge: bool, redis_url: str | None) -> None:
    """Remove a tenant: its keys stop working, its waiting jobs end `cancelled`. Its job
    records stay until they expire (the name cannot be reused meanwhile) unless --purge."""
    store, scripts = _store(redis_url)
    if not yes:
        click.confirm(f"remove tenant {name} and cancel its jobs?", abort=True)
    try:
        cancelled, running = store.remove(name, scripts, purge=purge)
    except TenantError as exc:
        fail(str(exc), 1)
    click.echo(
        f"tenant {name} removed: {cancelled} waiting jobs cancelled,"
        f" {running} dispatched jobs asked to stop"
    )


@tenant.group("key")
def key() -> None:
    """A tenant's API keys: several at once, so a rotation has no gap."""


@key.command("create")
@click.argument("name")
@redis_url_option
def key_create(name: str, redis_url: str | None) -> None:
    """A new key, printed once (only its hash is kept)."""
    store, _ = _store(redis_url)
    try:
        token, record = store.create_key(name)
    except TenantError as exc:
        fail(str(exc), 1)
    click.echo(token)
    click.echo(f"key {record.id} of {name}: keep it now, it is not shown again", err=True)


@key.command("revoke")
@click.argument("name")
@click.argument("key_id")
@redis_url_option
def key_revoke(name: str, key_id: str, redis_url: str | None) -> None:
    """Revoke a key: the next request with it gets 401."""
    store, _ = _store(redis_url)
    if not store.revoke_key(name, key_id):
        fail(f"tenant {name!r} has no key {key_id!r}", 1)
    click.echo(f"key {key_id} of {name} revoked")


@key.command("list")
@click.argument("name")
@redis_url_option
def key_list(name: str, redis_url: str | None) -> None:
    """List a tenant's keys: id, first characters, created (never the tokens)."""
    store, _ = _store(redis_url)
    for record in store.keys_of(name):
        click.echo(f"{record.id}  {record.shown}...  created {record.created:%Y-%m-%d %H:%M}")


@tenant.command("export")
@click.argument("file", type=click.Path(dir_okay=False, allow_dash=True, path_type=Path))
@redis_url_option
def export(file: Path, redis_url: str | None) -> None:
    """Write every tenant, its policy and its keys (their hashes, never the keys) to FILE
    (readable by you alone; `-`: stdout), for `tenant import` after a Redis loss."""
    store, _ = _store(redis_url)
    backup = tenant_backup.snapshot(store)
    text_ = backup.model_dump_json(indent=1) + "\n"
    if str(file) == "-":
        click.echo(text_, nl=False)
        return
    try:
        tenant_backup.write_private(file, text_)
    except OSError as exc:
        fail(f"{file}: {exc.strerror or exc}", 1)
    keys = sum(len(t.keys) for t in backup.tenants)
    click.echo(f"{len(backup.tenants)} tenants and {keys} keys written to {file}")


@tenant.command("import")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@redis_url_option
def import_(file: Path, redis_url: str | None) -> None:
    """Put back the tenants of a `tenant export` the farm does not have, with their keys
    (their users' keys work again). A tenant the farm has is left as it is."""
    try:
        backup = tenant_backup.read(file)
    except TenantsFileError as exc:
        fail(str(exc))
    store, _ = _store(redis_url)
    try:
        done = tenant_backup.restore(store, backup)
    except redis.RedisError as exc:  # each tenant is one Lua step: whole or absent
        whole = "each tenant is whole or absent: import again"
        full = isinstance(exc, redis.exceptions.OutOfMemoryError)
        fail(redis_failure(exc, f"{whole} once there is room") + ("" if full else f"; {whole}"), 1)
    click.echo(
        f"{len(done.restored)} tenants restored with {done.keys} keys;"
        f" {len(done.kept)} already in the farm, left as they are"
        + (
            f" ({', '.join(done.kept[:10])}{', ...' if len(done.kept) > 10 else ''})"
            if done.kept
            else ""
        )
    )
    for name, reason in done.refused.items():
        click.echo(f"tenant {name!r} not restored: {reason}", err=True)
    if done.refused:
        raise SystemExit(1)


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=int, default=8000, show_default=True)
@click.option("--workers", type=int, default=1, show_default=True, help="processes")
@redis_url_option
def gateway(host: str, port: int, workers: int, redis_url: str | None) -> None:
    """Serve the tenants' HTTP API (stateless: run as many as you like)."""
    import os

    import uvicorn

    from producer.gateway.protocol import MAX_HEAD_BYTES, GatewayProtocol

    settings = reachable_settings(redis_url=redis_url)
    os.environ["SANDFARM_REDIS_URL"] = settings.redis_url  # for the worker processes
    uvicorn.run(
        "producer.gateway:create_app",
        factory=True,
        host=host,
        port=port,
        workers=workers,
        log_level="info",
        proxy_headers=False,
        # h11 with bounded heads, a head timeout and connection bounds: httptools, the
        # default, buffers headers without a bound (producer/gateway/protocol.py)
        http=GatewayProtocol,
        h11_max_incomplete_event_size=MAX_HEAD_BYTES,
        ws="none",  # no WebSocket route: nothing to upgrade to
    )

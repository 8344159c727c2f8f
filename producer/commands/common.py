"""What every command shares: one-line failures with the right exit code, settings
validated into one line, and a farm client that fails in seconds when Redis is away."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, NoReturn

import click
from pydantic import ValidationError

from producer.protocol import FarmUnavailableError, Settings, get_settings
from producer.protocol.connection import check
from producer.protocol.errors import first_problem
from producer.terminal import MESSAGE_PREFIX, columns_of, one_line, terminal_rows

if TYPE_CHECKING:
    from producer.jobclient import JobClient


def fail(message: str, code: int = 2) -> NoReturn:
    """One line on stderr, then exit: bad input is 2, a farm failure 1."""
    # it may quote a spec: one line, and on a terminal cut into rows whose every one
    # after the first is indented (a key of spaces put `===` at column 0, a review)
    line = f"sandfarm: error: {one_line(message)}"
    tty = sys.stderr.isatty()
    click.echo(terminal_rows(line, tty, MESSAGE_PREFIX, "", columns_of(sys.stderr)), err=True)
    sys.exit(code)


def redis_failure(exc: Exception, when_full: str = "nothing was taken; try again later") -> str:
    """A Redis error a command met mid-way, in one line (``when_full``: what a full Redis
    left, and what to do)."""
    import redis

    if isinstance(exc, redis.exceptions.OutOfMemoryError):  # maxmemory, noeviction
        return f"the farm's Redis is full (maxmemory): {when_full}"
    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return f"the farm's Redis failed: {first}"


def farm_settings(**overrides: Any) -> Settings:
    """The settings, or one line naming the bad one (exit 1: the farm cannot be reached)."""
    try:
        return get_settings(**overrides)
    except ValidationError as exc:
        name, reason = first_problem(exc)
        fail(f"SANDFARM_{(name or 'settings').upper()}: {reason}", code=1)


def reachable_settings(**overrides: Any) -> Settings:
    """farm_settings(), after checking that Redis answers (one line and exit 1 if not)."""
    settings = farm_settings(**overrides)
    try:
        check(settings.redis_url)
    except FarmUnavailableError as exc:
        fail(str(exc), code=1)
    return settings


def api_key() -> str:
    key = os.environ.get("SANDFARM_API_KEY", "").strip()
    if not key:
        fail("--api needs the tenant's key in SANDFARM_API_KEY", 2)
    return key


def job_client(redis_url: str | None, api: str | None) -> JobClient:
    """The SDK a command talks through: the gateway's (a tenant: --api URL, key from
    SANDFARM_API_KEY) or Redis directly (the trusted FarmClient)."""
    if api:
        if not api.startswith(("http://", "https://")):
            fail(f"--api {api!r}: give the gateway's URL (http://host:port)", 2)
        from producer.gateway_client import GatewayClient

        return GatewayClient(api, api_key())
    from producer.client import FarmClient

    return FarmClient(settings=reachable_settings(redis_url=redis_url))


@contextlib.contextmanager
def closing_client(client: JobClient) -> Iterator[JobClient]:
    """The client, closed at the end (a FarmClient's Redis pool, a GatewayClient's HTTP)."""
    try:
        yield client
    finally:
        close = getattr(client, "close", None)
        if close is not None:
            close()

"""What every command shares: one-line failures with the right exit code, settings
validated into one line, and a farm client that fails in seconds when Redis is away."""

from __future__ import annotations

import sys
from typing import Any, NoReturn

import click
from pydantic import ValidationError

from producer.protocol import FarmUnavailableError, Settings, get_settings
from producer.protocol.connection import check


def fail(message: str, code: int = 2) -> NoReturn:
    """One line on stderr, then exit: bad input is 2, a farm failure 1."""
    click.echo(f"sandfarm: error: {message}", err=True)
    sys.exit(code)


def farm_settings(**overrides: Any) -> Settings:
    """The settings, or one line naming the bad one (exit 1: the farm cannot be reached)."""
    try:
        return get_settings(**overrides)
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        name = ".".join(str(p) for p in err["loc"]) or "settings"
        reason = str(err["msg"]).removeprefix("Value error, ")
        fail(f"SANDFARM_{name.upper()}: {reason}", code=1)


def reachable_settings(**overrides: Any) -> Settings:
    """farm_settings(), after checking that Redis answers (one line and exit 1 if not)."""
    settings = farm_settings(**overrides)
    try:
        check(settings.redis_url)
    except FarmUnavailableError as exc:
        fail(str(exc), code=1)
    return settings

"""Farm commands (worker, submit, batch, status, flower): they talk to Redis/Celery."""

from __future__ import annotations

import click


def register(group: click.Group) -> None:
    """Add the farm commands to the `sandfarm` group."""

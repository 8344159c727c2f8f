"""`sandfarm batch ...`: JSONL in, JSONL out, through the farm."""

from __future__ import annotations

import click


def register(group: click.Group) -> None:
    """Add the batch commands to the `sandfarm` group."""

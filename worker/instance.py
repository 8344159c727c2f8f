"""This worker's instance id: its heartbeat and its runs' records carry it, so a worker
started again under the same name (a rebooted host) tells its predecessor's runs from its
own (worker/lostworkers.py). Made once in the main process, which imports it before its
pool processes fork (worker/app.py), so they share it."""

from __future__ import annotations

import functools
import secrets

from sandbox_core.procid import identity

INSTANCE = secrets.token_hex(6)


@functools.cache
def process_identity(pid: int) -> str:
    """A pool process's identity, read once (its start time never changes)."""
    return identity(pid)

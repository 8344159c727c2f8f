"""A kombu 5.7 bug the farm works around (worker side only), with why.

After a broker loss, Celery's consumer collects and then closes the old connection. If
the first close of the Redis channel fails half-way (the broker is still away), the
connection's transport is detached before the second close, which then restores the
unacked messages through a new pool built from ``channel.connection.client`` — None by
then. The AttributeError is not one of the connection errors Celery's cleanup ignores,
so Celery logs "Unrecoverable error" and the worker exits: a Redis restart at the wrong
moment killed a worker in our fault suite (tests/faults, a restarted Redis mid-batch).
Same family as kombu issues #582 and #970. The patch turns it into the connection error
it is; the consumer then reconnects as after any broker loss, and the unacked messages
it could not restore are redelivered by the visibility timeout, as for a dead worker.
"""

from __future__ import annotations

from typing import Any

import redis
from kombu.transport import redis as kombu_redis

_original_connparams = kombu_redis.Channel._connparams


def _connparams(self: Any, asynchronous: bool = False) -> Any:
    if getattr(self.connection, "client", None) is None:
        raise redis.ConnectionError("the broker connection is closed (channel cleanup)")
    return _original_connparams(self, asynchronous=asynchronous)


def apply() -> None:
    if kombu_redis.Channel._connparams is not _connparams:
        kombu_redis.Channel._connparams = _connparams  # type: ignore[method-assign]

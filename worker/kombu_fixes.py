"""What the farm changes in kombu 5.7's Redis transport (worker side only), with why.

1. A connection error, not an AttributeError, after a broker loss.
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

2. One Redis client per channel. ``Channel.conn_or_acquire`` builds a new ``redis.Redis``
on the channel's pool for every publish, delivery and ack, and redis-py copies its
~170-entry response-callback table into each one: ~19% of a worker's main process CPU
at 2 slots (py-spy, ops/bench/RESULTS.md; docket measured the same, its PR #461). A
client is safe to share (each command checks a connection out of the pool; pipelines
stay per use), so the channel keeps one, rebuilt when the channel's pool is replaced.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis
from kombu.transport import redis as kombu_redis

_original_connparams = kombu_redis.Channel._connparams


def _connparams(self: Any, asynchronous: bool = False) -> Any:
    if getattr(self.connection, "client", None) is None:
        raise redis.ConnectionError("the broker connection is closed (channel cleanup)")
    return _original_connparams(self, asynchronous=asynchronous)


@contextmanager
def _conn_or_acquire(self: Any, client: Any = None) -> Iterator[Any]:
    if client:
        yield client
        return
    shared = self.__dict__.get("_sandfarm_client")
    if shared is None or shared.connection_pool is not self._pool:
        shared = self._create_client()  # builds the pool first if there is none
        self.__dict__["_sandfarm_client"] = shared
    yield shared


def apply() -> None:
    channel = kombu_redis.Channel
    if channel._connparams is not _connparams:
        channel._connparams = _connparams  # type: ignore[method-assign]
        channel.conn_or_acquire = _conn_or_acquire  # type: ignore[method-assign]

"""worker/kombu_fixes.py against kombu's real Redis transport and a real Redis."""

from __future__ import annotations

import uuid

import pytest
from kombu import Connection

from worker import kombu_fixes


@pytest.fixture
def channel(redis_url: str):
    kombu_fixes.apply()
    with Connection(redis_url) as conn:
        yield conn.default_channel


def test_one_redis_client_per_channel_rebuilt_with_its_pool(channel) -> None:
    queue = f"kombu-fix-{uuid.uuid4().hex[:8]}"
    with channel.conn_or_acquire() as first:
        first.lpush(queue, b"x")
    with channel.conn_or_acquire() as second:
        assert second is first  # no client built per command
        assert second.rpop(queue) == b"x"  # and it works
    given = object()
    with channel.conn_or_acquire(given) as passed:
        assert passed is given
    channel._disconnect_pools()  # what kombu does after a broker loss
    with channel.conn_or_acquire() as third:
        assert third is not first
        assert third.connection_pool is channel._pool
        assert third.ping()

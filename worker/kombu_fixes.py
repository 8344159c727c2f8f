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

3. A full Redis does not stop a worker. With ``maxmemory`` and ``noeviction``
(ops/start_redis.sh, the stack's Redis) Redis refuses writes that add memory, and every
command queued in a MULTI. kombu records a delivery, acks and requeues in MULTI
transactions, and the OutOfMemoryError reached Celery's event loop as an
"Unrecoverable error": the worker exited, and a job it had just popped was in no queue
(tests/faults: a full Redis refusing a store). Now a delivery is recorded unacked by a
script Redis runs even when full (``allow-oom``: the BRPOP just freed the message's
bytes, and the record holds them again), so the visibility timeout always has it; an ack
removes its message without MULTI (ZREM and HDEL free memory; Redis allows them when
full); a requeue Redis refuses leaves the message unacked, for the visibility timeout.
(An attack review: a delivery left unrecorded, of a job begun once before, was in no
queue, not unacked, and past recover()'s reach: lost.)

4. Messages as compact as they came. kombu writes the unacked record, and a message it
puts back, with the standard library's JSON escaping every non-ASCII character
(``\u00e9``: 6 bytes for 2, 12 for an emoji's 4), so a job's message of 8 MiB of
seeded text held up to 24 MiB more in Redis, counted by no quota, and through the
allow-oom record above past ``maxmemory`` (a second review: +172 MiB over it with 8
such jobs). The transport writes UTF-8 now, as the producer does (kombu's own encoder
where the standard one cannot: a lone surrogate, a type it does not know).

5. Each delivery's score, handed to its task. A dead worker's reaper gives back the
messages of its runs (worker/giveback.py), and must tell the delivery a run began under
from a later one (the message requeued and delivered to a live worker that has not
begun it). It compared kombu's score, the delivering host's clock, with the run's start
by Redis's: a host whose clock ran ahead of Redis's gave nothing back. The task now
finds the score kombu wrote in its message's properties (``sandfarm_delivered``), and
its run's record keeps it with the delivery tag: a message goes back only while that
very delivery stands (an attack review: a score read as the job began could already be
a redelivery's).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis
from kombu.transport import redis as kombu_redis
from kombu.transport import virtual
from kombu.utils.json import dumps as kombu_dumps

log = logging.getLogger(__name__)

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


def compact_dumps(value: Any, *args: Any, **kwargs: Any) -> Any:
    """JSON as UTF-8 without spaces (4.); kombu's encoder where the standard one fails."""
    if args or kwargs:  # a caller asking for kombu's own options gets them
        return kombu_dumps(value, *args, **kwargs)
    try:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
        text.encode()  # a lone surrogate cannot go to Redis as UTF-8
    except (TypeError, ValueError):  # UnicodeEncodeError is a ValueError
        return str(kombu_dumps(value))
    return text


_QoS = kombu_redis.QoS
_original_ack, _original_reject = _QoS.ack, _QoS.reject
# Where the task finds its delivery's score in the index (worker/chain.py).
DELIVERED_PROPERTY = "sandfarm_delivered"


def _remove_when_full(qos: Any, delivery_tag: str) -> None:
    """Ack ``delivery_tag`` in Redis without MULTI, which a full Redis refuses whole."""
    with qos.channel.conn_or_acquire() as client:
        pipe = client.pipeline(transaction=False)
        pipe.zrem(qos.unacked_index_key, delivery_tag).hdel(qos.unacked_key, delivery_tag)
        pipe.execute()


# kombu's append (ZADD the index, HSET the message), as one script a full Redis runs
_RECORD_WHEN_FULL = """#!lua flags=allow-oom
redis.call('ZADD', KEYS[1], ARGV[1], ARGV[2])
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
return 1
"""


def _append(self: Any, message: Any, delivery_tag: str) -> None:
    """kombu's append (the delivery's time in the index, the message in the hash), as a
    script when Redis is full (3.), and with the score written handed to the task in
    the message's properties (5.)."""
    delivery = message.delivery_info
    raw = kombu_redis.dumps([message._raw, delivery["exchange"], delivery["routing_key"]])
    score = kombu_redis.time()  # kombu's clock, as kombu stamps a delivery
    index, messages = self.unacked_index_key, self.unacked_key
    try:
        with self.pipe_or_acquire() as pipe:
            pipe.zadd(index, {delivery_tag: score}).hset(messages, delivery_tag, raw).execute()
    except redis.exceptions.OutOfMemoryError:
        with self.channel.conn_or_acquire() as client:
            client.eval(_RECORD_WHEN_FULL, 2, index, messages, score, delivery_tag, raw)
    virtual.QoS.append(self, message, delivery_tag)
    message.properties[DELIVERED_PROPERTY] = score  # after the write: never stored with it


def _ack(self: Any, delivery_tag: str) -> None:
    try:
        _original_ack(self, delivery_tag)
    except redis.exceptions.OutOfMemoryError:
        _remove_when_full(self, delivery_tag)
        virtual.QoS.ack(self, delivery_tag)


def _reject(self: Any, delivery_tag: str, requeue: bool = False) -> None:
    try:
        _original_reject(self, delivery_tag, requeue=requeue)
    except redis.exceptions.OutOfMemoryError as exc:
        if requeue:
            log.warning("Redis is full (%s): %s stays unacked until redelivered", exc, delivery_tag)
        else:
            _remove_when_full(self, delivery_tag)
        virtual.QoS.ack(self, delivery_tag)


def apply() -> None:
    channel = kombu_redis.Channel
    if channel._connparams is not _connparams:
        channel._connparams = _connparams  # type: ignore[method-assign]
        channel.conn_or_acquire = _conn_or_acquire  # type: ignore[method-assign]
        _QoS.append = _append  # type: ignore[method-assign]
        _QoS.ack = _ack  # type: ignore[method-assign]
        _QoS.reject = _reject  # type: ignore[method-assign]
        kombu_redis.dumps = compact_dumps  # type: ignore[assignment]  # records, put-backs

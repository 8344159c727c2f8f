"""A worker's heartbeat in Redis (``Keys.workers``): written by its reaper every interval,
stamped with Redis's clock, and removed when the worker ends, only if it is still its
own (a worker started again under the same name has written its own since)."""

from __future__ import annotations

import redis

from producer.protocol import Heartbeat
from producer.protocol.records import redis_clock

# One step, and allowed when Redis is full (the entry is rewritten in place, the same
# size): without it a live worker looked dead once Redis was full, and the others'
# reapers took its jobs and containers (an attack review). It returns the beat it
# replaced, read in the same step (a pipeline let another's write land between).
_BEAT = """#!lua flags=allow-oom
local replaced = redis.call('HGET', KEYS[1], ARGV[1])
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[3])
return replaced
"""

_FORGET_OWN = """#!lua flags=allow-oom
local stored = redis.call('HGET', KEYS[1], ARGV[1])
if not stored then return 0 end
local ok, beat = pcall(cjson.decode, stored)
if ARGV[2] ~= '' and ok and type(beat) == 'table' and beat['instance'] ~= ARGV[2] then
  return 0
end
return redis.call('HDEL', KEYS[1], ARGV[1])
"""


def beat(client: redis.Redis, key: str, name: str, info: Heartbeat, ttl: int) -> bytes | None:
    """Write the heartbeat; the one it replaced, if any."""
    record = info.model_copy(update={"ts": redis_clock(client)}).dump()
    replaced = client.eval(_BEAT, 1, key, name, record, ttl)
    return replaced if isinstance(replaced, bytes) else None


def forget(client: redis.Redis, key: str, name: str, instance: str) -> None:
    """Remove this worker's heartbeat, unless another instance of its name wrote it."""
    client.eval(_FORGET_OWN, 1, key, name, instance)

"""Storing a final JobResult: shared by the worker and by the client's cancel.

One Lua script, so a result is never stored without its announcement on the
submitting client's completion list, and a second result for the same job is never
stored, only counted.
"""

from __future__ import annotations

from typing import Any

import redis

from producer.settings import Settings
from sandbox_core import JobResult

# KEYS: result, done list ('' for none), duplicates counter, in-flight zset, running flag
# ARGV: result JSON, ttl seconds, job id, done-list cap
STORE_LUA = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'EX', ARGV[2]) then
  if KEYS[2] ~= '' then
    redis.call('RPUSH', KEYS[2], ARGV[3])
    redis.call('LTRIM', KEYS[2], -tonumber(ARGV[4]), -1)
    redis.call('EXPIRE', KEYS[2], ARGV[2])
  end
  redis.call('ZREM', KEYS[4], ARGV[3])
  redis.call('DEL', KEYS[5])
  return 1
end
redis.call('INCR', KEYS[3])
redis.call('ZREM', KEYS[4], ARGV[3])
return 0
"""


class ResultStore:
    def __init__(self, client: redis.Redis, settings: Settings) -> None:
        self.settings = settings
        self._script: Any = client.register_script(STORE_LUA)

    def store(self, result: JobResult, notify: str | None, count_duplicate: bool = True) -> bool:
        """First stored result wins; returns False (counted as a duplicate) otherwise."""
        keys = self.settings.keys
        job_id = result.id or ""
        stored = self._script(
            keys=[
                keys.result(job_id),
                notify or "",
                keys.duplicates if count_duplicate else keys.prefix + "stats:ignored",
                keys.in_flight,
                keys.running(job_id),
            ],
            args=[
                result.model_dump_json(),
                self.settings.result_ttl_s,
                job_id,
                self.settings.done_max_len,
            ],
        )
        return bool(stored)

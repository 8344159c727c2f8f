#!lua
-- (Redis 7's flags line, no flags: refused whole while Redis is over its maxmemory. A
-- move copies the job's message into the Celery queue; without it the first write, a
-- ZREM that Redis allows when full, let every copy after it through.)
-- The dispatch step alone: every worker's reaper and every gateway run it now and then,
-- so no single process's death stops dispatch.
-- ARGV: prefix, Celery queue, margin, max moves, active expiry (s). Returns jobs moved.
return dispatch(ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]))

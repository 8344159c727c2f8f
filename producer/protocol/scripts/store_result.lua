-- Store a job's final result once, announce it on the submitting client's list, count
-- the tenant's usage, free its dispatch slot and dispatch the next job, in one step.
-- The first stored result wins; a second one (a redelivered job) is only counted.
-- KEYS: result, done list ('' for none), duplicates counter, in-flight zset, running
-- flag, stats hash (protocol/stats.py)
-- ARGV: 1 result JSON, 2 ttl (s), 3 qid, 4 done-list cap, 5 prefix, 6 tenant ('' for
-- none), 7 UTC day, 8 status, 9 cpu ms, 10 wall ms, 11 result bytes, 12 Celery queue,
-- 13 margin, 14 active expiry (s), 15 finished at (epoch s, '' if unknown), 16 backend
-- label, 17 run-time bucket ('' if it did not run), 18 run s, 19 queue-wait bucket ('' if
-- unknown), 20 wait s, 21 stats ttl (s).
-- Returns 1 when stored, 0 for a duplicate. The result's phases.store_ms (null when
-- sent) becomes the time from finished to stored, by this host's clock: JSON strings
-- escape their quotes, so the first '"store_ms":null' is that field.
local qid, prefix, tenant = ARGV[3], ARGV[5], ARGV[6]
local payload = ARGV[1]
if ARGV[15] ~= '' then
  local t = redis.call('TIME')
  local ms = (tonumber(t[1]) + tonumber(t[2]) / 1e6 - tonumber(ARGV[15])) * 1000
  payload = string.gsub(payload, '"store_ms":null', string.format('"store_ms":%.3f', ms), 1)
end
if redis.call('SET', KEYS[1], payload, 'NX', 'EX', ARGV[2]) then
  if KEYS[2] ~= '' then
    redis.call('RPUSH', KEYS[2], qid)
    redis.call('LTRIM', KEYS[2], -tonumber(ARGV[4]), -1)
    redis.call('EXPIRE', KEYS[2], ARGV[2])
  end
  redis.call('ZREM', KEYS[4], qid)
  redis.call('DEL', KEYS[5])
  redis.call('DEL', prefix .. 'msg:' .. qid)  -- final without a begin (rejected, cancelled)
  -- the counters: one HINCRBY each, bucket chosen by the caller (fixed bounds)
  local backend = ARGV[16]
  local who = tenant ~= '' and tenant or 'none'
  redis.call('HINCRBY', KEYS[6], 'jobs|' .. who .. '|' .. backend .. '|' .. ARGV[8], 1)
  if ARGV[17] ~= '' then
    redis.call('HINCRBY', KEYS[6], 'run|' .. backend .. '|' .. ARGV[17], 1)
    redis.call('HINCRBYFLOAT', KEYS[6], 'run_sum|' .. backend, ARGV[18])
  end
  if ARGV[19] ~= '' then
    redis.call('HINCRBY', KEYS[6], 'wait|' .. backend .. '|' .. ARGV[19], 1)
    redis.call('HINCRBYFLOAT', KEYS[6], 'wait_sum|' .. backend, ARGV[20])
  end
  redis.call('EXPIRE', KEYS[6], ARGV[21])
  if tenant ~= '' then
    local usage = prefix .. 'usage:' .. tenant .. ':' .. ARGV[7]
    redis.call('HINCRBY', usage, 'jobs', 1)
    redis.call('HINCRBY', usage, 'status:' .. ARGV[8], 1)
    redis.call('HINCRBYFLOAT', usage, 'cpu_ms', ARGV[9])
    redis.call('HINCRBYFLOAT', usage, 'wall_ms', ARGV[10])
    redis.call('HINCRBY', usage, 'bytes', ARGV[11])
    redis.call('EXPIRE', usage, 9 * 86400)  -- a week of days to look back on
    redis.call('ZREM', prefix .. 'active:' .. tenant, qid)
    redis.call('ZREM', prefix .. 'active', qid)
    dispatch(prefix, ARGV[12], tonumber(ARGV[13]), 2, tonumber(ARGV[14]))
  end
  return 1
end
redis.call('INCR', KEYS[3])
redis.call('EXPIRE', KEYS[3], ARGV[2])
redis.call('ZREM', KEYS[4], qid)
return 0

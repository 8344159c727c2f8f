-- A worker takes a delivered job, in one round trip: stop if it is already final; else
-- count the attempt, flag it running (expiring soon after its deadline, so a killed pool
-- process leaves no stale flag), list it in flight, keep its tenant's dispatch slot only
-- until soon after its deadline, and read the cancel flag after setting ours (the
-- client sets cancel first, then looks for running: one of the two sees the other).
-- KEYS: result, attempts, running, cancel, in-flight zset, tenant's active zset ('' for
-- none), all active zset ('' for none)
-- ARGV: ttl, running JSON, running ttl, qid, in-flight expiry, now (epoch seconds)
-- Returns {attempts, cancelled}, or {-1, 0} when the job already has a result.
if redis.call('EXISTS', KEYS[1]) == 1 then return {-1, 0} end
local attempts = redis.call('INCR', KEYS[2])
redis.call('EXPIRE', KEYS[2], ARGV[1])
redis.call('SET', KEYS[3], ARGV[2], 'EX', ARGV[3])
-- entries past their expiry (jobs of killed workers) are dropped here and by status()
redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', ARGV[6])
redis.call('ZADD', KEYS[5], ARGV[5], ARGV[4])
if KEYS[6] ~= '' then
  redis.call('ZADD', KEYS[6], 'XX', ARGV[5], ARGV[4])
  redis.call('ZADD', KEYS[7], 'XX', ARGV[5], ARGV[4])
end
return {attempts, redis.call('EXISTS', KEYS[4])}

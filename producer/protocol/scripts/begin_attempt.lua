-- A worker takes a delivered job, in one round trip: stop if it is already final; else
-- count the attempt, flag it running (expiring soon after its deadline, so a killed pool
-- process leaves no stale flag), list it in flight, keep its tenant's dispatch slot only
-- until soon after its deadline, and read the cancel flag after setting ours (the
-- client sets cancel first, then looks for running: one of the two sees the other).
-- KEYS: result, attempts, running, cancel, in-flight zset, tenant's active zset ('' for
-- none), all active zset ('' for none), stats hash, the job's waiting message
-- ARGV: ttl, running JSON, running ttl, qid, in-flight expiry, now (epoch seconds),
-- stats ttl
-- Returns {attempts, cancelled, dispatch expiry ('' if unknown)}: the expiry dispatch
-- gave the job tells when it was dispatched; or {-1, 0, ''} when it has a result.
if redis.call('EXISTS', KEYS[1]) == 1 then return {-1, 0, ''} end
local attempts = redis.call('INCR', KEYS[2])
-- begun: from here kombu's unacked restore redelivers it, not dispatch's recovery
redis.call('DEL', KEYS[9])
redis.call('EXPIRE', KEYS[2], ARGV[1])
if attempts > 1 then  -- delivered again: its worker died, or its ack was lost
  redis.call('HINCRBY', KEYS[8], 'redeliveries', 1)
  redis.call('EXPIRE', KEYS[8], ARGV[7])
end
redis.call('SET', KEYS[3], ARGV[2], 'EX', ARGV[3])
-- entries past their expiry (jobs of killed workers) are dropped here and by status()
redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', ARGV[6])
redis.call('ZADD', KEYS[5], ARGV[5], ARGV[4])
local dispatched = ''
if KEYS[6] ~= '' then
  dispatched = redis.call('ZSCORE', KEYS[7], ARGV[4]) or ''
  redis.call('ZADD', KEYS[6], 'XX', ARGV[5], ARGV[4])
  redis.call('ZADD', KEYS[7], 'XX', ARGV[5], ARGV[4])
end
return {attempts, redis.call('EXISTS', KEYS[4]), dispatched}

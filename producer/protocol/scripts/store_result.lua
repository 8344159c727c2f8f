-- Store a job's final result once, and announce it on the submitting client's list.
-- The first stored result wins; a second one (a redelivered job) is only counted.
-- KEYS: result, done list ('' for none), duplicates counter, in-flight zset, running flag
-- ARGV: result JSON, ttl seconds, job id, done-list cap
-- Returns 1 when stored, 0 for a duplicate.
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
redis.call('EXPIRE', KEYS[3], ARGV[2])
redis.call('ZREM', KEYS[4], ARGV[3])
return 0

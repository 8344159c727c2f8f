-- A worker takes a delivered message's job (lib_begin.lua's begin_job). A message may
-- carry a chain (finish_job.lua): its slot stored its job's result and ran further jobs
-- under it, then died (or lost its ack) during one of them. That job is the one to run
-- again now, whatever became of the message's own result (it may have expired): this
-- delivery takes the chain over (its token), so the old chain, should it still be
-- alive, stops at its next step.
-- ARGV: 1 prefix, 2 the message's task id (its job's qid), 3 running JSON, 4 running
-- ttl (s) of that job, 5 result ttl (s), 6 stats ttl (s), 7 this delivery's chain
-- token, 8 chain ttl (s), 9 task name, 10 hard limit margin (s), 11 running margin (s).
-- Returns {attempts, cancelled, dispatch expiry ('' if unknown), qid to run ('' for
-- none), its message ('': the delivered one)}; attempts -1: nothing to run.
local prefix, qid = ARGV[1], ARGV[2]
local now = now_s()
local chain = prefix .. 'chain:' .. qid
local current, raw = unpack(redis.call('HMGET', chain, 'q', 'm'))
if current and raw then
  local job, timeout = job_of(raw, ARGV[9], tonumber(ARGV[10]))
  if job == current then
    local a, c, d = begin_job(prefix, job, ARGV[3], timeout + tonumber(ARGV[11]), now,
      ARGV[5], ARGV[6])
    if a >= 0 then
      redis.call('HSET', chain, 'o', ARGV[7])
      redis.call('EXPIRE', chain, ARGV[8])
      return {a, c, d, job, raw}
    end
  end
  -- the chain's job is final: the chain is over, and so is this message's own job
  redis.call('DEL', chain)
  return {-1, 0, '', '', ''}
end
local a, c, d = begin_job(prefix, qid, ARGV[3], tonumber(ARGV[4]), now, ARGV[5], ARGV[6])
if a >= 0 then return {a, c, d, qid, ''} end
return {-1, 0, '', '', ''}

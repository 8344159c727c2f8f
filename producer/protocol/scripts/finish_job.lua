-- Store a job's result (lib_store.lua's store, with its KEYS and ARGV 1-21) and, for a
-- chain that still has time, hand its slot the next job in the same step: the message
-- a worker's BRPOP would take next (dispatch just refilled the Celery queue by fair
-- share), begun here (lib_begin.lua). A chain runs under its first message, which stays
-- unacked: its record (chain:<that message's qid>) names the job now running, so a
-- redelivery of the message runs that job again (begin_attempt.lua).
-- ARGV 22 the chain's qid (its message's), 23 this delivery's token, 24 '1' to take a
-- next job, 25 the longest job (s) that may still start, 26 running JSON, 27 running
-- margin (s), 28 hard limit margin (s), 29 task name, 30 result ttl (s), 31 chain ttl
-- (s), 32 event channel ('' for none), 33 the job's task events (published once stored),
-- 34 this call's token (lib_store: a retried call finds its own result), 35 its ttl (s),
-- 36 when ARGV 25 was measured (epoch s, the worker's clock): a step that arrives late (a
-- retry after a lost connection) has that much less room; 37 the spec hash of the stored
-- job (lib_store: a result is stored for its record's job only).
-- Returns {stored (1, 0 for a duplicate, 2: this call stored it before its answer was
-- lost, 3: not its record's job's), next qid ('' for none), its message, attempts,
-- cancelled, dispatch expiry}.
local prefix, qid, queue = ARGV[5], ARGV[3], ARGV[12]
local root, token = ARGV[22], ARGV[23]
local chain = prefix .. 'chain:' .. root
local owner, current, held = unpack(redis.call('HMGET', chain, 'o', 'q', 'm'))

local function store_only()
  local stored = store(KEYS, ARGV, ARGV[34], ARGV[35], ARGV[37])
  if stored == 1 and ARGV[32] ~= '' then redis.call('PUBLISH', ARGV[32], ARGV[33]) end
  return {stored, '', '', 0, 0, ''}
end

if owner and owner ~= token then
  -- a redelivery of the chain's message took it over (begin_attempt, or another chain
  -- here): stop, storing only
  return store_only()
end
if not owner and qid ~= root then
  -- a job this chain took, whose record is gone: its chain was taken over and has ended
  -- since; this one stops too (its message was acked by the new owner's delivery)
  return store_only()
end
if current and current ~= qid and held then
  -- this chain's last step took `current` already and its answer was lost (a retry)
  local attempts = redis.call('GET', prefix .. 'attempts:' .. current) or '1'
  local stored = redis.call('GET', KEYS[7]) == ARGV[34] and 2 or 0
  local cancelled = redis.call('EXISTS', prefix .. 'cancel:' .. current)
  return {stored, current, held, tonumber(attempts), cancelled, ''}
end
local stored = store(KEYS, ARGV, ARGV[34], ARGV[35], ARGV[37])
if stored == 1 and ARGV[32] ~= '' then redis.call('PUBLISH', ARGV[32], ARGV[33]) end

-- Take ``job`` (its message ``raw``) as this chain's next; the caller has checked it fits.
local function take(job, raw, timeout, now)
  local a, c, d = begin_job(prefix, job, ARGV[26], timeout + tonumber(ARGV[27]), now,
    ARGV[30], ARGV[21])
  if a < 0 then return nil end
  redis.call('HSET', chain, 'q', job, 'm', raw, 'o', token)
  redis.call('EXPIRE', chain, ARGV[31])
  redis.call('HINCRBY', prefix .. 'stats', 'chained', 1)
  redis.call('EXPIRE', prefix .. 'stats', ARGV[21])
  return {stored, job, raw, a, c, d}
end

if ARGV[24] == '1' then
  local now = now_s()
  local room = tonumber(ARGV[25]) - math.max(0, now - tonumber(ARGV[36]))
  for _ = 1, 64 do
    local raw = redis.call('RPOP', queue)
    if not raw then break end
    local job, timeout = job_of(raw, ARGV[29], tonumber(ARGV[28]))
    if not job or timeout > room then
      redis.call('RPUSH', queue, raw)  -- back where it was, for a worker's own delivery
      break
    end
    local taken = take(job, raw, timeout, now)
    if taken then return taken end
    -- Its job is final. A message that comes back may carry a chain whose slot died
    -- running another job (begin_attempt's case): that job continues in this chain,
    -- the message it came with is done; a job that does not fit waits for a worker's
    -- own delivery of the message.
    local other = prefix .. 'chain:' .. job
    local dead, dead_raw = unpack(redis.call('HMGET', other, 'q', 'm'))
    if dead and dead_raw then
      local next_job, next_timeout = job_of(dead_raw, ARGV[29], tonumber(ARGV[28]))
      if next_job ~= dead or next_timeout > room then
        redis.call('RPUSH', queue, raw)
        break
      end
      redis.call('DEL', other)
      taken = take(dead, dead_raw, next_timeout, now)
      if taken then return taken end
    end
    -- final, and no chain: consumed, as a worker's begin would
  end
end
redis.call('DEL', chain)
return {stored, '', '', 0, 0, ''}

#!lua
-- (Redis 7's flags line, no flags: refused whole, before any write, while Redis is over
-- its maxmemory. Without it Redis refuses only a script's first write that adds memory,
-- and lets every write through once any write is done: this one's first can be a DEL.)
-- Admit a tenant's jobs and dispatch what the farm has room for, in one atomic step.
-- ARGV: 1 prefix, 2 tenant, 3 ttl (s), 4 mode ("all": refuse the whole call on any
-- conflict; "some": take the rest), 5 max queued, 6 rate ("" for none), 7 burst,
-- 8 CPU budget today in ms ("" for none), 9 UTC day, 10 Celery queue, 11 margin,
-- 12 active expiry (s), 13 n, 14 stats ttl (s); then per job: qid, spec hash, state
-- JSON, message; then max queued bytes, result bytes budget today ("" for none), the end of
-- ARGV 9's day (epoch s: a call its client prepared before midnight is judged on that
-- day, and told to wait only until it ends).
-- Returns {"ok", the code of each job ("new" | "same" | "conflict"), space-separated}, or a refusal
-- {"conflict", index...} | {"queue_full", waiting, max, new jobs} | {"rate", retry_after_ms,
-- new jobs}
-- | {"queue_bytes", queued bytes, these jobs' bytes, max} | {"budget", retry_after_s,
-- "cpu"} | {"budget", retry_after_s, "result_bytes", counted today, these jobs' charge,
-- the least of one}: a refusal writes only its counter (jobs refused, by reason, in the
-- stats hash). Queued bytes: leave_queue in lib_dispatch.lua. The result budget: each new
-- job's state record starts with its charge ('{"kept":N', result_budget.py), what its
-- result keeps at the least; admission counts it in the day's 'kept' at once (the day
-- ARGV 9 names, its record's "at"), the store the rest (lib_store.lua).
local prefix, tenant = ARGV[1], ARGV[2]
local ttl, mode = tonumber(ARGV[3]), ARGV[4]
local max_queued, rate, burst = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local budget, day, queue = tonumber(ARGV[8]), ARGV[9], ARGV[10]
local margin, expiry, n = tonumber(ARGV[11]), tonumber(ARGV[12]), tonumber(ARGV[13])
local now = now_s()
local max_bytes, result_budget = tonumber(ARGV[15 + 4 * n]), tonumber(ARGV[16 + 4 * n])
local day_end = tonumber(ARGV[17 + 4 * n]) or (now - now % 86400 + 86400)
local until_day_end = tostring(math.max(1, math.ceil(day_end - now)))
local function refused(reason, count)
  local stats = prefix .. 'stats'
  redis.call('HINCRBY', stats, 'refused|' .. tenant .. '|' .. reason, count)
  redis.call('EXPIRE', stats, ARGV[14])
end

-- The tenant's token bucket (its rate limit), read once a call. A call needs a token
-- before its ids are read, and takes max(new jobs, 1) if admitted, 1 if refused for
-- anything: each call reads every id and dispatches (an attack review: calls of known or
-- conflicting ids took none). Taken once, at the end: taken in two parts, a refusal's
-- wait left the bucket a token short again and again (a review: no job admitted in 25 s
-- at a rate of 1). Level and time are written whole (%.17g): a time rounded up made a
-- call of the same instant come up a fraction short.
local bucket = prefix .. 'bucket:' .. tenant
local level = 0
if rate then
  local tokens = tonumber(redis.call('HGET', bucket, 'tokens') or burst)
  local last = tonumber(redis.call('HGET', bucket, 'ts') or now)
  level = math.min(burst, tokens + math.max(0, now - last) * rate)
end
local function spend(cost)
  if not rate then return end
  redis.call('HSET', bucket, 'tokens', string.format('%.17g', level - cost),
    'ts', string.format('%.17g', now))
  redis.call('EXPIRE', bucket, math.ceil(burst / rate) + 60)
end
-- A rate refusal: the wait until the bucket holds ``want`` again, after ``spent``.
local function over_rate(want, spent, new)
  refused('rate', n)
  return {'rate', tostring(math.max(1, math.ceil((want - level + spent) / rate * 1000))), new}
end
if rate and level < 1 then return over_rate(1, 0, 0) end

local codes, new, conflicts, charge, least = {}, 0, {}, 0, nil
for i = 0, n - 1 do
  local qid, hash = ARGV[15 + 4 * i], ARGV[16 + 4 * i]
  local state = redis.call('GET', prefix .. 'job:' .. qid)
  if not state then
    codes[i + 1] = 'new'
    new = new + 1
    local one = tonumber(string.match(ARGV[17 + 4 * i], '^{"kept":(%d+)') or '0')
    charge = charge + one
    if not least or one < least then least = one end
  else
    local ok, s = pcall(cjson.decode, state)
    local known = ok and type(s) == 'table' and s.spec or ''
    if known == '' or known == hash then
      codes[i + 1] = 'same'
    else
      codes[i + 1] = 'conflict'
      conflicts[#conflicts + 1] = i
    end
  end
end
if mode == 'all' and #conflicts > 0 then
  refused('conflict', n)
  spend(1)
  return {'conflict', unpack(conflicts)}
end
if #conflicts > 0 then refused('conflict', #conflicts) end


if new > 0 then
  if budget then
    local used = tonumber(redis.call('HGET', prefix .. 'usage:' .. tenant .. ':' .. day, 'cpu_ms') or '0')
    if used >= budget then
      refused('budget', n)
      spend(1)
      return {'budget', until_day_end, 'cpu'}
    end
  end
  if result_budget then  -- what today's results keep (lib_store.lua kept_by), and charges
    local counted = tonumber(redis.call('HGET', prefix .. 'usage:' .. tenant .. ':' .. day, 'kept') or '0')
    if counted + charge > result_budget then
      refused('budget', n)
      spend(1)
      return {'budget', until_day_end, 'result_bytes',
        tostring(counted), tostring(charge), tostring(least)}
    end
  end
  local pending = prefix .. 'pending:' .. tenant
  local waiting = redis.call('LLEN', pending)
  if waiting + new > max_queued then
    refused('queue_full', n)
    spend(1)
    return {'queue_full', waiting, max_queued, new}
  end
  local queued, sizes, adding = prefix .. 'queued:' .. tenant, {}, 0
  if waiting == 0 then  -- nothing waits: nothing is held (see leave_queue)
    redis.call('DEL', prefix .. 'sizes:' .. tenant, queued)
  end
  for i = 0, n - 1 do
    if codes[i + 1] == 'new' then
      sizes[i + 1] = #ARGV[17 + 4 * i] + #ARGV[18 + 4 * i]
      adding = adding + sizes[i + 1]
    end
  end
  local held = tonumber(redis.call('GET', queued) or '0')
  if max_bytes and held + adding > max_bytes then
    refused('queue_bytes', n)
    spend(1)
    return {'queue_bytes', held, adding, max_bytes}
  end
  if rate and level < new then
    spend(1)
    return over_rate(new, 1, new)
  end
  -- a tenant with nothing waiting or running starts at the farm's clock
  if waiting == 0 and redis.call('ZCARD', prefix .. 'active:' .. tenant) == 0 then
    local clock = tonumber(redis.call('GET', prefix .. 'vclock') or '0')
    local mine = tonumber(redis.call('HGET', prefix .. 'vtime', tenant) or '0')
    if mine < clock then redis.call('HSET', prefix .. 'vtime', tenant, clock) end
  end
  local jobs = prefix .. 'jobs:' .. tenant
  -- the queue, the sizes in step with it (lib_dispatch leave_queue) and the job list
  -- take a call's jobs in slices of one command each
  local qids, sized, listed = {}, {}, {}
  local function flush()
    if #qids == 0 then return end
    redis.call('RPUSH', pending, unpack(qids))
    redis.call('RPUSH', prefix .. 'sizes:' .. tenant, unpack(sized))
    redis.call('ZADD', jobs, unpack(listed))
    qids, sized, listed = {}, {}, {}
  end
  for i = 0, n - 1 do
    if codes[i + 1] == 'new' then
      local qid = ARGV[15 + 4 * i]
      redis.call('SET', prefix .. 'job:' .. qid, ARGV[17 + 4 * i], 'EX', ttl)
      redis.call('SET', prefix .. 'msg:' .. qid, ARGV[18 + 4 * i], 'EX', ttl)
      qids[#qids + 1] = qid
      sized[#sized + 1] = sizes[i + 1]
      listed[#listed + 1] = now + i * 1e-6  -- one batch listed in its order
      listed[#listed + 1] = qid
      if #qids == 500 then flush() end  -- well under Lua's stack for unpack
    end
  end
  flush()
  redis.call('INCRBY', queued, adding)
  if charge > 0 then
    local usage = prefix .. 'usage:' .. tenant .. ':' .. day
    redis.call('HINCRBY', usage, 'kept', charge)
    redis.call('EXPIRE', usage, 9 * 86400)  -- as lib_store.lua's
  end
  redis.call('ZREMRANGEBYSCORE', jobs, '-inf', now - ttl)
  redis.call('SADD', prefix .. 'ready', tenant)
  -- refreshed while in use; gone once the farm is idle. The farm's own keys (every
  -- tenant's) only ever get longer: a tenant whose jobs live a minute must not make
  -- another's waiting jobs vanish from dispatch's view (ready) a minute later.
  for _, key in ipairs({jobs, pending, prefix .. 'sizes:' .. tenant, queued}) do
    redis.call('EXPIRE', key, ttl)
  end
  for _, key in ipairs({prefix .. 'ready', prefix .. 'vtime'}) do
    if redis.call('TTL', key) < ttl then redis.call('EXPIRE', key, ttl) end
  end
end
spend(math.max(new, 1))
dispatch(prefix, queue, margin, math.max(new, 1), expiry)
return {'ok', table.concat(codes, ' ')}  -- one string: unpack fails past ~8,000 codes

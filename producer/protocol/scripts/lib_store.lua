-- store(K, A): store a job's final result once, announce it on the submitting client's
-- list, count the tenant's usage, free its dispatch slot and dispatch the next job, in
-- one step (after lib_dispatch). The first stored result wins; a second one (a
-- redelivered job) is only counted, unless it is the same call sent again: the client
-- lost its answer and its retry resent it, with the same token.
-- K (keys): result, done list ('' for none), duplicates counter, in-flight zset, running
-- flag, stats hash (protocol/stats.py), stored-by (the token of the storing call)
-- A (args): 1 result JSON, 2 ttl (s), 3 qid, 4 done-list cap, 5 prefix, 6 tenant ('' for
-- none), 7 UTC day, 8 status, 9 cpu ms, 10 wall ms, 11 slot s (the run less its wait for
-- the slot: what fair share charges), 12 Celery queue,
-- 13 margin, 14 active expiry (s), 15 finished at (epoch s, '' if unknown), 16 backend
-- label, 17 run-time bucket ('' if it did not run), 18 run s, 19 queue-wait bucket ('' if
-- unknown), 20 wait s, 21 stats ttl (s); token: this call's own (random), kept token_ttl
-- (s): as long as the client may send this call again.
-- Returns 1 when stored, 0 for a duplicate, 2 when this same call stored it already (the
-- first send's answer was lost: nothing is done or counted again), 3 when the result is
-- not its record's job's (orphaned, below: refused, counted). The result's
-- phases.store_ms (null when sent) becomes the time from finished to stored, by this
-- host's clock: JSON strings escape their quotes, so the first '"store_ms":null' is
-- that field.
-- Past its tenant's result budget for today (result_mb_per_day, counted in the bytes
-- kept: kept_by), a result is kept without its output: its id, status and labels, and a
-- message saying why. Admission refuses the tenant's next jobs then, but the jobs it
-- admitted before may still finish: their output cannot grow Redis past the budget, and
-- what they keep without it was charged at their admission (the job record's first
-- fields, result_budget.py). So the store counts what the result keeps less that charge,
-- which gives back the charge's slack when it keeps less (stored without output, or a
-- cancel): the day's count is what its results keep, plus the charges of its jobs not
-- stored yet. A job stored on another day than it was charged on is counted whole on the
-- day it is stored, its charge given back to the day it was charged on (an attack review:
-- charges on the days a backlog was admitted, outputs on the day it stored, put ~2x the
-- budget in one day's results).
-- The budget counts what a result keeps in Redis (usage field 'kept'), so tiny jobs at a
-- high rate are bounded too: its bytes as the allocator holds them (jemalloc: 4 size
-- classes per doubling, up to 25% over the bytes) and its job's keys besides (record,
-- attempts, stored-by token, job-list entry, a cancel mark; the submitting client's
-- completion list, one per client name): ~550 B for a short id and no client, ~2.7 KB
-- for the longest id, a new client and a cancel, at or above what MEMORY USAGE measures
-- (test_tenant_bytes.py). 'bytes' stays the results' own bytes, as the usage shows them.
local function allocated(n)
  if n <= 64 then return 64 end
  local step = 2 ^ (math.floor(math.log(n) / math.log(2)) - 2)
  return math.ceil(n / step) * step
end

local function kept_by(payload, qid, prefix, notify)
  local client = notify ~= '' and 256 + 2 * #notify or 0  -- its list, and the record's name
  -- 736: the job's fixed keys, and 16 B in each of the keyspace's two tables (keys,
  -- expiries) for each of its 5 keys: the tables double in steps (a second review)
  return allocated(#payload + 16) + 736 + 7 * (#qid + #prefix) + client
end

local LABELS_OBJECT = '"labels":{'
local function beyond(charged, payload, qid, prefix, notify)
  return kept_by(payload, qid, prefix, notify) - charged
end

-- (charge, day, record JSON) admission counted for the job whose record is ``record``, or
-- (0, nil)
local CHARGE = '^{"kept":(%d+),"at":"(%d%d%d%d)%-(%d%d)%-(%d%d)'  -- its day: the record's
local function charge_of(record)
  local state = redis.call('GET', record) or ''
  local charged, y, m, d = string.match(state, CHARGE)
  if not charged then return 0, nil end
  return tonumber(charged), y .. m .. d, state
end

-- A charge is given back once: the record's says 0 from then on (a second review: a
-- cancel stored again once the first one's result expired before its record, as a farm
-- TTL shorter than the tenant's makes it, gave the charge back again and again).
local function charge_given_back(record, state)
  local rest = string.sub(state, #string.match(state, '^{"kept":%d+') + 1)
  redis.call('SET', record, '{"kept":0' .. rest, 'KEEPTTL')
end

local function within_budget(prefix, tenant, usage, payload, qid, status, notify, charged)
  local cap = tonumber(policy_of(prefix, tenant).result_mb_per_day)
  if not cap then return payload end
  local used = tonumber(redis.call('HGET', usage, 'kept') or '0')
  if used + beyond(charged, payload, qid, prefix, notify) <= cap * 1048576 then return payload end
  local labels = '{}'  -- the last '"labels":{' is the result's own (result_fields.py)
  local tail = string.sub(payload, -131072)
  local at, from = nil, 1
  while true do
    local found = string.find(tail, LABELS_OBJECT, from, true)
    if not found then break end
    at, from = found, found + 1
  end
  if at then labels = string.sub(tail, at + #LABELS_OBJECT - 1, -2) end
  local id = string.match(qid, '^[^/]+/(.+)$') or qid
  return '{"id":' .. cjson.encode(id) .. ',"status":' .. cjson.encode(status)
    .. ',"message":' .. cjson.encode('output dropped: today\'s result budget ('
      .. cap .. ' MiB, result_mb_per_day) is stored already') .. ',"labels":' .. labels .. '}'
end

-- Is this result not its record's job's? ``own``: the spec hash of the job the storing
-- worker ran ('' to skip the check: a cancel, whose caller read the record). Redis
-- restarted empty while a job ran, then its id was submitted again with other code: the
-- old run's result, stored under the new record, answered for code that never ran, and
-- stored first it left no record, so the other code was admitted and given it (a
-- reliability review). So a result is stored only under a record of the spec that ran.
-- A missing record is not written back: nothing tells the tenant that submitted the job
-- from a team given its name since (a review of that rewrite: a purged tenant's late
-- result went to the newcomer and took its id); its client is told the job is lost and
-- sends it again.
local function orphaned(record, own)
  if own == '' then return false end
  local state = redis.call('GET', record)
  if not state then return true end
  local ok, s = pcall(cjson.decode, state)
  local known = ok and type(s) == 'table' and s.spec or ''
  return known ~= '' and known ~= own
end

local function store(K, A, token, token_ttl, own)
  local qid, prefix, tenant = A[3], A[5], A[6]
  local payload = A[1]
  if redis.call('EXISTS', K[1]) == 0 and orphaned(prefix .. 'job:' .. qid, own or '') then
    redis.call('HINCRBY', K[6], 'orphaned', 1)
    redis.call('EXPIRE', K[6], A[21])
    redis.call('ZREM', K[4], qid)
    return 3
  end
  if A[15] ~= '' then
    local t = redis.call('TIME')
    local ms = (tonumber(t[1]) + tonumber(t[2]) / 1e6 - tonumber(A[15])) * 1000
    payload = string.gsub(payload, '"store_ms":null', string.format('"store_ms":%.3f', ms), 1)
  end
  local usage = prefix .. 'usage:' .. tenant .. ':' .. A[7]
  local record = prefix .. 'job:' .. qid
  local charged, charged_on, state = 0, nil, nil
  if tenant ~= '' then
    charged, charged_on, state = charge_of(record)
    local today = charged_on == A[7] and charged or 0
    payload = within_budget(prefix, tenant, usage, payload, qid, A[8], K[2], today)
  end
  -- A removed tenant's name is held while its results may live (removed:<tenant>, set
  -- by `tenant remove`): a result its jobs store later lives no longer than that, so the
  -- name is never given to a new team while one does (a review: stored after a purge,
  -- a new team under the name read it).
  local ttl = tonumber(A[2])
  if tenant ~= '' then
    local held = redis.call('TTL', prefix .. 'removed:' .. tenant)
    if held > 0 and held < ttl then ttl = held end
  end
  if redis.call('SET', K[1], payload, 'NX', 'EX', ttl) then
    redis.call('SET', K[7], token, 'EX', token_ttl)
    if K[2] ~= '' then
      redis.call('RPUSH', K[2], qid)
      redis.call('LTRIM', K[2], -tonumber(A[4]), -1)
      redis.call('EXPIRE', K[2], ttl)
    end
    redis.call('ZREM', K[4], qid)
    redis.call('DEL', K[5])
    redis.call('DEL', prefix .. 'msg:' .. qid)  -- final without a begin (rejected, cancelled)
    -- The job's record (its spec hash: a resubmission of the id with other code is a
    -- conflict) lives as long as its result, never less: its TTL ran from submission.
    local left = redis.call('TTL', record)
    if left >= 0 and left < ttl then redis.call('EXPIRE', record, ttl) end
    -- the counters: one HINCRBY each, bucket chosen by the caller (fixed bounds)
    local backend = A[16]
    local who = tenant ~= '' and tenant or 'none'
    redis.call('HINCRBY', K[6], 'jobs|' .. who .. '|' .. backend .. '|' .. A[8], 1)
    if A[17] ~= '' then
      redis.call('HINCRBY', K[6], 'run|' .. backend .. '|' .. A[17], 1)
      redis.call('HINCRBYFLOAT', K[6], 'run_sum|' .. backend, A[18])
    end
    if A[19] ~= '' then
      redis.call('HINCRBY', K[6], 'wait|' .. backend .. '|' .. A[19], 1)
      redis.call('HINCRBYFLOAT', K[6], 'wait_sum|' .. backend, A[20])
    end
    redis.call('EXPIRE', K[6], A[21])
    if tenant ~= '' then
      redis.call('HINCRBY', usage, 'jobs', 1)
      redis.call('HINCRBY', usage, 'status:' .. A[8], 1)
      redis.call('HINCRBYFLOAT', usage, 'cpu_ms', A[9])
      redis.call('HINCRBYFLOAT', usage, 'wall_ms', A[10])
      redis.call('HINCRBY', usage, 'bytes', #payload)  -- as stored
      if charged_on == A[7] then
        redis.call('HINCRBY', usage, 'kept', beyond(charged, payload, qid, prefix, K[2]))
      else
        redis.call('HINCRBY', usage, 'kept', kept_by(payload, qid, prefix, K[2]))
        local then_usage = prefix .. 'usage:' .. tenant .. ':' .. (charged_on or '')
        if charged > 0 and redis.call('HEXISTS', then_usage, 'kept') == 1 then
          redis.call('HINCRBY', then_usage, 'kept', -charged)
        end
      end
      if charged > 0 then charge_given_back(record, state) end
      redis.call('EXPIRE', usage, 9 * 86400)  -- a week of days to look back on
      redis.call('ZREM', prefix .. 'active:' .. tenant, qid)
      redis.call('ZREM', prefix .. 'active', qid)
      charge_for_run(prefix, tenant, qid, A[17] ~= '' and A[11] or nil)  -- '': not measured
      dispatch(prefix, A[12], tonumber(A[13]), 2, tonumber(A[14]))
    end
    return 1
  end
  if redis.call('GET', K[7]) == token then return 2 end
  redis.call('INCR', K[3])
  redis.call('EXPIRE', K[3], A[2])
  redis.call('ZREM', K[4], qid)
  return 0
end

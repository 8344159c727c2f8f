-- dispatch(): move waiting jobs into the Celery queue while the farm has room, choosing
-- each job's tenant by weighted fair share. Shared by submit_jobs, store_result and
-- dispatch (Redis runs a script atomically: a job is moved once or not at all).
--
-- Room: the slots of the online workers consuming the queue (fresh heartbeats), plus a
-- small margin, minus the jobs already dispatched and not final (active). Choice: among
-- the tenants with waiting jobs and under their max_running, the lowest virtual time
-- (slot seconds received / weight). A dispatch charges its tenant the job's timeout (the
-- slot time it may hold: a job's length is known only once it has run), and its stored
-- result replaces the charge with the time it held its slot (charge_for_run, lib_store),
-- so a tenant of hour-long jobs and one of second-long jobs each get half the slots'
-- time, not half the dispatches. A tenant that had nothing waiting or running starts at
-- the farm's clock (the last dispatch's time), so an idle tenant never saves up a burst.
-- Keys are built from the prefix (one Redis).
local function now_s()
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1e6
end

local function slots_of(prefix, queue, now)
  local slots = 0
  local beats = redis.call('HGETALL', prefix .. 'workers')
  for i = 1, #beats, 2 do
    local ok, b = pcall(cjson.decode, beats[i + 1])
    if ok and type(b) == 'table' and b.ts and now - b.ts <= 3 * (b.interval_s or 5) + 2 then
      for _, q in ipairs(b.queues or {}) do
        if q == queue then
          slots = slots + (b.concurrency or 0)
          break
        end
      end
    end
  end
  return slots
end

-- Every job costs at least this much slot time (s): one that ends at once (cancelled,
-- rejected, `true`) still took a dispatch, a delivery and a store.
local MIN_CHARGE_S = 0.01

-- The slot time a dispatched job may hold: its timeout, from its state record.
local function slot_s_of(prefix, qid)
  local ok, s = pcall(cjson.decode, redis.call('GET', prefix .. 'job:' .. qid) or '')
  local slot = ok and type(s) == 'table' and tonumber(s.slot_s)
  return math.max(slot or 1, MIN_CHARGE_S)  -- a record without one: an older producer's
end

-- Charge ``tenant`` for dispatching ``qid`` at virtual time ``v`` (weight ``w``); the
-- charge is kept (charged:<tenant>, qid -> "charge weight") until the job's result is
-- stored, long enough for the job to be delivered and run to its timeout.
local function charge(prefix, tenant, qid, v, w, expiry_s)
  local slot = slot_s_of(prefix, qid)
  local charged = prefix .. 'charged:' .. tenant
  redis.call('HSET', prefix .. 'vtime', tenant, v + slot / w)
  redis.call('HSET', charged, qid, string.format('%.17g %.17g', slot / w, w))
  local keep = math.ceil(2 * expiry_s + slot)
  if redis.call('TTL', charged) < keep then redis.call('EXPIRE', charged, keep) end
end

-- A job is final: its tenant's charge becomes the slot time it held, by the weight it
-- was charged at: ``held_s`` as its worker measured it (at least MIN_CHARGE_S); its
-- whole timeout when the worker could not say (a soft or hard time limit, a job that
-- killed its worker); nothing more than the floor if it never began (cancelled while
-- queued); and a whole timeout more for each earlier attempt, whose slot died with it.
-- Only a job charged and not yet settled counts (HDEL: once, whatever a redelivery
-- stores later); never below 0 (the virtual times may have expired meanwhile).
local function charge_for_run(prefix, tenant, qid, held_s)
  local charged = prefix .. 'charged:' .. tenant
  local raw = redis.call('HGET', charged, qid)
  if not raw or redis.call('HDEL', charged, qid) == 0 then return end
  local paid, w = string.match(raw, '^(%S+) (%S+)$')
  paid, w = tonumber(paid), tonumber(w)
  if not paid or not w or w <= 0 then return end
  local slot = paid * w
  local attempts = tonumber(redis.call('GET', prefix .. 'attempts:' .. qid) or '0')
  local held = MIN_CHARGE_S
  if attempts > 0 then
    held = math.max(tonumber(held_s) or slot, MIN_CHARGE_S) + (attempts - 1) * slot
  end
  local vtime = prefix .. 'vtime'
  local v = tonumber(redis.call('HGET', vtime, tenant) or '0')
  redis.call('HSET', vtime, tenant, math.max(0, v - paid + held / w))
end

-- A tenant's queued bytes: what the jobs in its queue (pending:<tenant>) hold in Redis,
-- their messages and state records. A list of their sizes moves in step with the queue
-- (sizes:<tenant>: pushed with each job, popped with it), and queued:<tenant> is their
-- sum; the three are written and expire together. A job counts until dispatch takes it
-- from the queue, as max_queued counts it: cancelled or expired while waiting too.
-- Called after the queue's pop. The sizes describe the newest jobs: jobs queued by a
-- farm that kept no sizes (an upgrade) pop none, and an emptied queue takes its sizes
-- and sum with it, so a count that went wrong (a tenant removed mid-submission) is
-- corrected when its queue next empties.
local function leave_queue(prefix, tenant)
  local pending, sizes = prefix .. 'pending:' .. tenant, prefix .. 'sizes:' .. tenant
  local queued = prefix .. 'queued:' .. tenant
  local left = redis.call('LLEN', pending)
  if left == 0 then
    redis.call('DEL', sizes, queued)
    return
  end
  if redis.call('LLEN', sizes) <= left then return end
  local size = tonumber(redis.call('LPOP', sizes) or '')
  if size and redis.call('DECRBY', queued, size) <= 0 then redis.call('DEL', queued) end
end

local function policy_of(prefix, tenant)
  local raw = redis.call('GET', prefix .. 'tenant:' .. tenant)
  if raw then
    local ok, p = pcall(cjson.decode, raw)
    if ok and type(p) == 'table' then return p end
  end
  return {weight = 1}
end

-- A dispatched job keeps its message (msg:<qid>) until a worker begins it. When its
-- dispatch entry expires (a visibility timeout after the move) and no attempt has begun,
-- the message is looked for where it should be: still in the Celery queue (by task id:
-- kombu re-serialises a message it restores), or delivered and in kombu's unacked hash
-- (keyed by the delivery tag the message carries). Found, the job stays counted as
-- dispatched; found nowhere (a Redis that died between a worker's BRPOP and kombu's
-- unacked write forgets the delivery, while the worker that took the message lost it
-- with its connection), it is pushed again. When unsure (a queue too long to read), it
-- waits for the next round. A job may run twice this way, never zero times: begin
-- refuses a job with a result, store keeps the first.
local RECOVER_SCAN_MAX = 1000  -- queue entries read to look for a job (normally ~slots)

local function queued_ids(queue)
  if redis.call('LLEN', queue) > RECOVER_SCAN_MAX then return nil end
  local ids = {}
  for _, raw in ipairs(redis.call('LRANGE', queue, 0, -1)) do
    local ok, m = pcall(cjson.decode, raw)
    if ok and type(m) == 'table' and type(m.headers) == 'table' and m.headers.id then
      ids[m.headers.id] = true
    end
  end
  return ids
end

local function recover(prefix, queue, now, expiry_s)
  local active = prefix .. 'active'
  local expired = redis.call('ZRANGEBYSCORE', active, '-inf', now, 'LIMIT', 0, 1000)
  local ids  -- the queue's task ids, read once and only if needed
  for _, qid in ipairs(expired) do
    redis.call('ZREM', active, qid)
    local msg = redis.call('GET', prefix .. 'msg:' .. qid)
    if msg and redis.call('EXISTS', prefix .. 'result:' .. qid) == 0
        and redis.call('EXISTS', prefix .. 'attempts:' .. qid) == 0 then
      local ok, m = pcall(cjson.decode, msg)
      local tag = ok and type(m) == 'table' and type(m.properties) == 'table'
        and m.properties.delivery_tag
      -- 'unacked': kombu's default unacked_key (protocol/keys.py KOMBU_UNACKED)
      local delivered = tag and redis.call('HEXISTS', 'unacked', tag) == 1
      if not delivered then
        if ids == nil then ids = queued_ids(queue) or false end
        if ids and not ids[qid] then
          redis.call('LPUSH', queue, msg)
          redis.call('HINCRBY', prefix .. 'stats', 'recovered', 1)
        end
      end
      local tenant = string.match(qid, '^([^/]+)/')
      if tenant then redis.call('ZADD', prefix .. 'active:' .. tenant, now + expiry_s, qid) end
      redis.call('ZADD', active, now + expiry_s, qid)
    end
  end
end

-- Queue entries one dispatch may pop of one tenant without moving a job (cancelled
-- while waiting, or expired): each costs its tenant MIN_CHARGE_S; past them the tenant is
-- out of this call's choice and the others still move; the rest wait for the next call.
-- A tenant that cancelled 21,000 of its queued jobs made one call pop them all,
-- re-reading every tenant's state at each pop: 4.4 s with 47 tenants waiting, Redis
-- frozen for all (an attack review); a bound on the call alone let its dead entries
-- end 78 calls in a row that moved nothing while others waited (a review of that fix).
-- MAX_DEAD_POPS_IN_ALL bounds a call whatever the number of tenants, and fewer of them
-- the more tenants wait: each pop looks at every one (DEAD_POP_LOOKS a call; a review
-- saw 0.68 s with 2,000 tenants at 4,096).
local MAX_DEAD_POPS = 256
local MAX_DEAD_POPS_IN_ALL = 16 * MAX_DEAD_POPS
local DEAD_POP_LOOKS = 262144

-- The tenants with waiting jobs, read once a call: name -> {cap, w, running, v}, and
-- how many.
local function waiting_tenants(prefix, now)
  local found, count = {}, 0
  for _, t in ipairs(redis.call('SMEMBERS', prefix .. 'ready')) do
    local p = policy_of(prefix, t)
    local mine = prefix .. 'active:' .. t
    redis.call('ZREMRANGEBYSCORE', mine, '-inf', now)  -- jobs of killed workers
    local cap = p.max_running
    if cap == cjson.null then cap = nil end
    found[t] = {
      cap = cap, w = tonumber(p.weight) or 1, running = redis.call('ZCARD', mine),
      v = tonumber(redis.call('HGET', prefix .. 'vtime', t) or '0'),
    }
    count = count + 1
  end
  return found, count
end

-- The tenant under its max_running with the lowest virtual time (ties: by name).
local function next_tenant(tenants)
  local best, best_t
  for t, c in pairs(tenants) do
    if c.cap == nil or c.running < c.cap then
      if best == nil or c.v < best.v or (c.v == best.v and t < best_t) then
        best, best_t = c, t
      end
    end
  end
  return best_t, best
end

local function dispatch(prefix, queue, margin, max_moves, expiry_s)
  local now = now_s()
  local active = prefix .. 'active'
  recover(prefix, queue, now, expiry_s)
  local slots = slots_of(prefix, queue, now)
  if slots == 0 then return 0 end  -- no worker online: a worker's reaper dispatches at start
  local room = slots + margin - redis.call('ZCARD', active)
  if room <= 0 then return 0 end
  local tenants, count = waiting_tenants(prefix, now)
  local most_dead = math.max(MAX_DEAD_POPS, math.min(MAX_DEAD_POPS_IN_ALL,
    math.floor(DEAD_POP_LOOKS / math.max(count, 1))))
  local moved, dead = 0, 0
  while moved < max_moves and room > 0 and dead < most_dead do
    local best, c = next_tenant(tenants)
    if best == nil then break end
    local pending = prefix .. 'pending:' .. best
    local qid = redis.call('LPOP', pending)
    leave_queue(prefix, best)
    if redis.call('LLEN', pending) == 0 then
      redis.call('SREM', prefix .. 'ready', best)
      tenants[best] = nil
    end
    local msg = qid and redis.call('GET', prefix .. 'msg:' .. qid)
    -- cancelled while waiting (it has a result), or expired: nothing to run; the
    -- message stays until a worker begins the job (see recover)
    if msg and redis.call('EXISTS', prefix .. 'result:' .. qid) == 0 then
      -- Workers BRPOP from the right. A tenant with nothing dispatched goes to the
      -- front: its job runs at the next free slot instead of behind the margin's
      -- worth of jobs a busy tenant already has queued (the Celery queue is a buffer
      -- for throughput, not a second ordering). A busy tenant's jobs keep FIFO.
      local mine = prefix .. 'active:' .. best
      if c.running == 0 then
        redis.call('RPUSH', queue, msg)
      else
        redis.call('LPUSH', queue, msg)
      end
      redis.call('ZADD', mine, now + expiry_s, qid)
      redis.call('ZADD', active, now + expiry_s, qid)
      charge(prefix, best, qid, c.v, c.w, expiry_s)
      redis.call('SET', prefix .. 'vclock', c.v)
      c.running = c.running + 1
      c.v = tonumber(redis.call('HGET', prefix .. 'vtime', best))
      moved = moved + 1
      room = room - 1
    else
      dead = dead + 1
      c.dead = (c.dead or 0) + 1
      c.v = c.v + MIN_CHARGE_S / c.w  -- a pop is work: the next turn may be another's
      redis.call('HSET', prefix .. 'vtime', best, c.v)
      if c.dead >= MAX_DEAD_POPS then tenants[best] = nil end
    end
  end
  return moved
end

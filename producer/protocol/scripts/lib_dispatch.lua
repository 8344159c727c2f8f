-- dispatch(): move waiting jobs into the Celery queue while the farm has room, choosing
-- each job's tenant by weighted fair share. Shared by submit_jobs, store_result and
-- dispatch (Redis runs a script atomically: a job is moved once or not at all).
--
-- Room: the slots of the online workers consuming the queue (fresh heartbeats), plus a
-- small margin, minus the jobs already dispatched and not final (active). Choice: among
-- the tenants with waiting jobs and under their max_running, the lowest virtual time
-- (work received / weight); a dispatch adds 1/weight to its tenant's. A tenant that had
-- nothing waiting or running starts at the farm's clock (the last dispatch's time), so
-- an idle tenant never saves up a burst. Keys are built from the prefix (one Redis).
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

local function policy_of(prefix, tenant)
  local raw = redis.call('GET', prefix .. 'tenant:' .. tenant)
  if raw then
    local ok, p = pcall(cjson.decode, raw)
    if ok and type(p) == 'table' then return p end
  end
  return {weight = 1}
end

local function dispatch(prefix, queue, margin, max_moves, expiry_s)
  local now = now_s()
  local active = prefix .. 'active'
  redis.call('ZREMRANGEBYSCORE', active, '-inf', now)
  local slots = slots_of(prefix, queue, now)
  if slots == 0 then return 0 end  -- no worker online: a worker's reaper dispatches at start
  local room = slots + margin - redis.call('ZCARD', active)
  local moved = 0
  while moved < max_moves and room > 0 do
    local best, best_v, best_w
    for _, t in ipairs(redis.call('SMEMBERS', prefix .. 'ready')) do
      local p = policy_of(prefix, t)
      local cap = p.max_running
      local mine = prefix .. 'active:' .. t
      redis.call('ZREMRANGEBYSCORE', mine, '-inf', now)  -- jobs of killed workers
      local running = redis.call('ZCARD', mine)
      if cap == nil or cap == cjson.null or running < cap then
        local v = tonumber(redis.call('HGET', prefix .. 'vtime', t) or '0')
        if best == nil or v < best_v or (v == best_v and t < best) then
          best, best_v, best_w = t, v, tonumber(p.weight) or 1
        end
      end
    end
    if best == nil then break end
    local pending = prefix .. 'pending:' .. best
    local qid = redis.call('LPOP', pending)
    if redis.call('LLEN', pending) == 0 then redis.call('SREM', prefix .. 'ready', best) end
    if qid then
      local key = prefix .. 'msg:' .. qid
      local msg = redis.call('GET', key)
      redis.call('DEL', key)
      -- cancelled while waiting (it has a result), or expired: nothing to run
      if msg and redis.call('EXISTS', prefix .. 'result:' .. qid) == 0 then
        redis.call('LPUSH', queue, msg)
        redis.call('ZADD', prefix .. 'active:' .. best, now + expiry_s, qid)
        redis.call('ZADD', active, now + expiry_s, qid)
        redis.call('HSET', prefix .. 'vtime', best, best_v + 1 / best_w)
        redis.call('SET', prefix .. 'vclock', best_v)
        moved = moved + 1
        room = room - 1
      end
    end
  end
  return moved
end

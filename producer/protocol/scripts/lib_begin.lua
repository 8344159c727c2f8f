-- begin_job(): a worker takes a job, in the same step that hands it over: stop if it is
-- already final; else count the attempt, flag it running (expiring soon after its
-- deadline, so a killed pool process leaves no stale flag), list it in flight, keep its
-- tenant's dispatch slot only until soon after its deadline, and read the cancel flag
-- after setting ours (the client sets cancel first, then looks for running: one of the
-- two sees the other). Keys are built from the prefix (protocol/keys.py).
-- Returns attempts (-1: final already), cancelled (0/1), and the expiry dispatch gave
-- the job ('' if unknown), which tells when it was dispatched.
local function tenant_of(qid)
  return string.match(qid, '^([^/]+)/') or ''  -- "tenant/id"; ids never hold a '/'
end

local function begin_job(prefix, qid, running, running_for, now, ttl, stats_ttl)
  if redis.call('EXISTS', prefix .. 'result:' .. qid) == 1 then return -1, 0, '' end
  local counter = prefix .. 'attempts:' .. qid
  local attempts = redis.call('INCR', counter)
  -- begun: from here a redelivery (kombu's, or its chain's) brings it back, not dispatch
  redis.call('DEL', prefix .. 'msg:' .. qid)
  redis.call('EXPIRE', counter, ttl)
  if attempts > 1 then  -- delivered again: its worker died, or its ack was lost
    redis.call('HINCRBY', prefix .. 'stats', 'redeliveries', 1)
    redis.call('EXPIRE', prefix .. 'stats', stats_ttl)
  end
  -- stamped with when it began, by Redis's clock (worker/giveback.py: for a record
  -- without its delivery's tag and score, which the worker writes into it)
  local stamped = string.sub(running, 1, -2) .. string.format(',"at":%.3f}', now)
  redis.call('SET', prefix .. 'running:' .. qid, stamped, 'EX', math.max(1, math.floor(running_for)))
  -- entries past their expiry (jobs of killed workers) are dropped here and by status()
  local inflight = prefix .. 'inflight'
  redis.call('ZREMRANGEBYSCORE', inflight, '-inf', now)
  redis.call('ZADD', inflight, now + running_for, qid)
  local dispatched = ''
  local tenant = tenant_of(qid)
  if tenant ~= '' then
    dispatched = redis.call('ZSCORE', prefix .. 'active', qid) or ''
    redis.call('ZADD', prefix .. 'active:' .. tenant, 'XX', now + running_for, qid)
    redis.call('ZADD', prefix .. 'active', 'XX', now + running_for, qid)
  end
  return attempts, redis.call('EXISTS', prefix .. 'cancel:' .. qid), dispatched
end

-- A job's wall timeout from its task message (the hard time limit the producer set is
-- the timeout + hard_margin), or nil for a message that is not a farm job.
local function job_of(raw, task_name, hard_margin)
  local ok, m = pcall(cjson.decode, raw)
  local h = ok and type(m) == 'table' and type(m.headers) == 'table' and m.headers
  if not h or h.task ~= task_name or type(h.id) ~= 'string' then return nil end
  local limits = type(h.timelimit) == 'table' and h.timelimit
  local hard = limits and tonumber(limits[1])
  if not hard then return nil end
  return h.id, hard - hard_margin
end

-- A tenant's queued bytes: what its jobs submitted and not yet begun hold in Redis (each
-- one's message and state JSON). One hash per tenant, queued:<tenant>, with a field per
-- such job (its qid -> its bytes) and the field 'total' (their sum, kept in the same
-- step as each field, so the two never drift: a qid holds a '/', 'total' does not).
-- submit_jobs adds a field per admitted job (before every other library: all use it);
-- queued_release() takes one away when the job's message leaves Redis: begun
-- (lib_begin), final without a begin (lib_store), or found expired by dispatch. Only
-- the step whose HDEL removed the field gives its bytes back: a redelivery, a duplicate
-- or a second release finds no field and gives nothing. The hash lives with the
-- tenant's TTL, refreshed by each submission, as its pending list does.
local function queued_key(prefix, qid)
  local tenant = string.match(qid, '^([^/]+)/')
  return tenant and prefix .. 'queued:' .. tenant
end

local function queued_release(prefix, qid)
  local key = queued_key(prefix, qid)
  if not key then return end
  local size = redis.call('HGET', key, qid)
  if size and redis.call('HDEL', key, qid) == 1 then
    redis.call('HINCRBY', key, 'total', -tonumber(size))
  end
end

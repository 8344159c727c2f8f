-- The dispatch step alone: every worker's reaper and every gateway run it now and then,
-- so no single process's death stops dispatch.
-- ARGV: prefix, Celery queue, margin, max moves, active expiry (s). Returns jobs moved.
return dispatch(ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]))

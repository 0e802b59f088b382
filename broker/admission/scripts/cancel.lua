-- Cancel a call. ARGV: call_id, ttl_s.
-- Returns {outcome, message}; outcome is 'queued' (taken out before it was dispatched: it never starts; the
-- caller stores its cancelled result), 'signalled' (dispatched or running: the
-- flag stops it before it starts, the pub/sub message kills it where it runs),
-- 'finished' or 'unknown'.
local id, ttl = ARGV[1], tonumber(ARGV[2])
if redis.call('EXISTS', DONE .. id) == 1 then
  return {'finished', false}
end
local fields = redis.call('HMGET', META .. id, 'kind', 'agent', 'lane', 'queue')
local kind, agent, lane, queue = fields[1], fields[2], fields[3], fields[4]
if not kind then
  return {'unknown', false}
end
redis.call('SET', CANCEL .. id, '1', 'EX', ttl)
if not lane and redis.call('LREM', pending_key(kind, agent, queue), 1, id) == 1 then
  local message = redis.call('GET', CALL .. id)
  redis.call('DEL', META .. id, CALL .. id)
  return {'queued', message}
end
redis.call('PUBLISH', CANCEL_CHANNEL, id)
return {'signalled', false}

-- A worker received a call's message: may it run it?
-- ARGV: call_id, hostname, lease_ms
-- Returns 'run' (the claim is ours, lease extended), 'done' (a result exists),
-- 'busy' (another live worker holds the claim) or 'cancelled'.
local id, host, lease = ARGV[1], ARGV[2], tonumber(ARGV[3])
if redis.call('EXISTS', P .. 'done:' .. id) == 1 then
  return 'done'
end
if not redis.call('SET', P .. 'claim:' .. id, host, 'NX', 'PX', lease) then
  return 'busy'
end
if redis.call('EXISTS', P .. 'cancel:' .. id) == 1 then
  return 'cancelled'
end
local fields = redis.call('HMGET', P .. 'meta:' .. id, 'kind', 'agent', 'lane')
local kind, agent, lane = fields[1], fields[2], fields[3]
if kind and lane then
  -- The dispatch lease covered the wait in the queue; from now on it covers
  -- the run: the tool's time limit plus grace.
  local expiry = now_ms() + lease
  redis.call('ZADD', P .. kind .. ':running:' .. agent, 'XX', expiry, id)
  redis.call('ZADD', P .. 'inflight:' .. lane, 'XX', expiry, id)
  redis.call('ZADD', P .. kind .. ':leases', 'XX', expiry, id)
end
return 'run'

-- A worker received a call's message: may it run it?
-- ARGV: call_id, hostname, lease_ms, host ('' = no turn affinity), home_ttl_s,
--       here ('1': the turn's folder exists on this host), max_calls
-- Returns {outcome, lost, dispatched}: outcome 'run' (the claim is ours, lease
-- extended), 'done' (a result exists), 'busy' (another live worker holds the
-- claim, or the call was queued again meanwhile), 'cancelled', or 'moved' (the
-- call's turn is homed on another live host: the call was put back in that
-- host's home lane, and `dispatched` is for the caller to publish). `lost`:
-- see take_home in lib.lua.
local id, host, lease = ARGV[1], ARGV[2], tonumber(ARGV[3])
local host_id, home_ttl, here = ARGV[4] or '', tonumber(ARGV[5] or '0'), ARGV[6] or ''
local max_calls = tonumber(ARGV[7]) or MAX_DISPATCH
if redis.call('EXISTS', DONE .. id) == 1 then
  return {'done', 0, {}}
end
local meta = META .. id
local fields = redis.call('HMGET', meta, 'kind', 'agent', 'lane', 'turn', 'seen')
local kind, agent, lane, turn, seen = fields[1], fields[2], fields[3], fields[4], fields[5]
local lost = 0
if host_id ~= '' and kind and turn then
  if not lane or redis.call('EXISTS', CLAIM .. id) == 1 then
    -- Queued again (its host was given up) or held: this delivery is stale.
    return {'busy', 0, {}}
  end
  local mine = base_of(lane) .. HOME_SEPARATOR .. host_id
  local home
  home, lost = take_home(agent, turn, mine, home_ttl, here, seen, true)
  if home ~= mine then
    local out, touched = {}, {}
    requeue(id, kind, agent, lane, home, touched)
    dispatch_for(kind, agent, lane, out, max_calls, touched)
    return {'moved', 0, out}
  end
end
if not redis.call('SET', CLAIM .. id, host, 'NX', 'PX', lease) then
  return {'busy', 0, {}}
end
if redis.call('EXISTS', CANCEL .. id) == 1 then
  return {'cancelled', lost, {}}
end
if kind and lane then
  -- The dispatch lease covered the wait in the queue; from now on it covers
  -- the run: the tool's time limit plus grace.
  local expiry = now_ms() + lease
  redis.call('ZADD', kind_key(kind, RUNNING, agent), 'XX', expiry, id)
  redis.call('ZADD', INFLIGHT .. lane, 'XX', expiry, id)
  redis.call('ZADD', kind_key(kind, LEASES), 'XX', expiry, id)
end
return {'run', lost, {}}

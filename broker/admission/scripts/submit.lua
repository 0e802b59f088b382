-- Queue one call and dispatch.
-- ARGV: call_id, kind, agent, message, limit, lease_ms, record_ttl_s, turn ('' = none), max_calls,
--       envelope, route, tag ('' = none: the caller publishes the call; see broker/envelope.py),
--       affinity ('1': the call follows its turn's home), seen ('1': the client saw the turn homed)
local id, kind, agent, message = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local limit, lease_ms, ttl = ARGV[5], ARGV[6], tonumber(ARGV[7])
local turn, max_calls = ARGV[8], tonumber(ARGV[9])
local envelope, route, tag = ARGV[10] or '', ARGV[11] or '', ARGV[12] or ''
local affinity, seen = ARGV[13] or '', ARGV[14] or ''
if redis.call('EXISTS', META .. id) == 1 or redis.call('EXISTS', DONE .. id) == 1 then
  return redis.error_reply('call id ' .. id .. ' is already known')
end
redis.call('SET', CALL .. id, message, 'EX', ttl)
local meta = META .. id
-- 'at' (submitted, ms): `vessel-workers status` shows the oldest queued call's age.
redis.call('HSET', meta, 'kind', kind, 'agent', agent, 'lease_ms', lease_ms, 'at', now_ms())
if envelope ~= '' then
  redis.call('HSET', meta, 'envelope', envelope, 'route', route, 'tag', tag)
end
redis.call('HSET', kind_key(kind, LIMIT), agent, limit)
if turn ~= '' then
  redis.call('SADD', TURN .. turn, id)
  redis.call('EXPIRE', TURN .. turn, ttl)
end
local out = {}
if turn ~= '' and affinity == '1' then
  redis.call('HSET', meta, 'turn', turn, 'seen', seen)
  -- A turn homed on a live host: straight to that host's home lane.
  local home = live_home(agent, turn)
  if home then
    redis.call('EXPIRE', meta, ttl)
    redis.call('RPUSH', pending_key(kind, agent, home), id)
    redis.call('HSET', meta, 'queue', home)
    place_home(kind, agent, home)
    dispatch(kind, home, out, max_calls)
    return out
  end
end
redis.call('EXPIRE', meta, ttl)
redis.call('RPUSH', kind_key(kind, PENDING, agent), id)
local lane = redis.call('HGET', kind_key(kind, WHERE), agent)
if not lane then
  lane = enqueue_agent(kind, agent)
end
dispatch(kind, lane, out, max_calls)
return out

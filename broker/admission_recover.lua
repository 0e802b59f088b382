-- Take back what dead workers held, then dispatch. ARGV: kind, max_calls.
-- 1. A call whose lease expired without a result (its worker died or hangs) goes
--    back to the head of its agent's queue, to be dispatched again.
-- 2. A call whose lease expired with a result only lost its release: release it.
-- 3. Agents waiting on a dedicated lane whose workers are all gone move to the
--    shared lane.
-- Returns {dispatched, finished}: finished are {id, message} released in case 2
-- (the caller checks that their result was stored: see broker/admission.py).
local kind, max_calls = ARGV[1], tonumber(ARGV[2])
local now = now_ms()
local out, finished = {}, {}
local leases = P .. kind .. ':leases'
for _, id in ipairs(redis.call('ZRANGEBYSCORE', leases, '-inf', now, 'LIMIT', 0, 1000)) do
  local claim_ttl = redis.call('PTTL', P .. 'claim:' .. id)
  if redis.call('EXISTS', P .. 'done:' .. id) == 1 then
    finished[#finished + 1] = {id, redis.call('GET', P .. 'call:' .. id) or ''}
    release(id)
  elseif claim_ttl > 0 then
    -- Claimed and the claim still lives: the lease follows the claim.
    redis.call('ZADD', leases, 'XX', now + claim_ttl, id)
  else
    local meta = P .. 'meta:' .. id
    local fields = redis.call('HMGET', meta, 'agent', 'lane')
    local agent, lane = fields[1], fields[2]
    redis.call('ZREM', leases, id)
    if agent and lane then
      redis.call('ZREM', P .. kind .. ':running:' .. agent, id)
      redis.call('ZREM', P .. 'inflight:' .. lane, id)
      redis.call('HDEL', meta, 'lane')
      redis.call('LPUSH', P .. kind .. ':pending:' .. agent, id)
      if not redis.call('HGET', P .. kind .. ':where', agent) then
        enqueue_agent(kind, agent)
      elseif redis.call('SISMEMBER', P .. kind .. ':blocked', agent) == 1 then
        settle_agent(kind, agent)
      end
    end
  end
end
local shared = shared_lane(kind)
for _, lane in ipairs(redis.call('SMEMBERS', P .. kind .. ':lanes')) do
  if redis.call('EXISTS', P .. 'window:' .. lane) == 0 then
    local ring = P .. 'ring:' .. lane
    local agent = redis.call('LPOP', ring)
    while agent do
      redis.call('HSET', P .. kind .. ':where', agent, shared)
      redis.call('RPUSH', P .. 'ring:' .. shared, agent)
      agent = redis.call('LPOP', ring)
    end
  else
    dispatch(kind, lane, out, max_calls)
  end
end
dispatch(kind, shared, out, max_calls)
return {out, finished}

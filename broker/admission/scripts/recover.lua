-- Take back what dead workers held, then dispatch. ARGV: kind, max_calls.
-- 1. A call whose lease expired without a result (its worker died or hangs) goes
--    back to the head of its queue, to be dispatched again: its home lane's if
--    it was dispatched to a home lane that is still alive, else its agent's.
-- 2. A call whose lease expired with a result only lost its release: release it.
-- 3. Agents waiting on a dedicated lane whose workers are all gone move to the
--    shared lane.
-- 4. A home lane whose host is gone (no live worker): the calls queued for it
--    move to the head of their agents' queues, and so do the calls dispatched
--    to it that no worker claimed; they run elsewhere and their turns are
--    homed again (with the lost-workspace note, claim.lua).
-- Returns {dispatched, finished}: finished are {id, message} released in case 2
-- (the caller checks that their result was stored: see broker/admission/__init__.py).
local kind, max_calls = ARGV[1], tonumber(ARGV[2])
local now = now_ms()
local out, finished, touched = {}, {}, {}
local leases = kind_key(kind, LEASES)
for _, id in ipairs(redis.call('ZRANGEBYSCORE', leases, '-inf', now, 'LIMIT', 0, RECOVER_BATCH)) do
  local claim_ttl = redis.call('PTTL', CLAIM .. id)
  if redis.call('EXISTS', DONE .. id) == 1 then
    finished[#finished + 1] = {id, redis.call('GET', CALL .. id) or ''}
    release(id)
  elseif claim_ttl > 0 then
    -- Claimed and the claim still lives: the lease follows the claim.
    redis.call('ZADD', leases, 'XX', now + claim_ttl, id)
  else
    local fields = redis.call('HMGET', META .. id, 'agent', 'lane')
    local agent, lane = fields[1], fields[2]
    redis.call('ZREM', leases, id)
    if agent and lane then
      local home = nil
      if is_home_lane(lane) and redis.call('EXISTS', WINDOW .. lane) == 1 then
        home = lane
      end
      requeue(id, kind, agent, lane, home, touched)
    end
  end
end

-- Case 4 for one home lane.
local function evacuate(lane)
  local placed = PLACED .. lane
  for _, agent in ipairs(redis.call('SMEMBERS', placed)) do
    local from, base = pending_key(kind, agent, lane), pending_key(kind, agent, nil)
    -- Oldest first at the head of the agent's queue: take from the tail.
    local id = redis.call('RPOP', from)
    while id do
      redis.call('LPUSH', base, id)
      redis.call('HDEL', META .. id, 'queue')
      id = redis.call('RPOP', from)
    end
    unpark(kind, agent, lane)
    if not redis.call('HGET', kind_key(kind, WHERE), agent) then
      enqueue_agent(kind, agent)
    end
  end
  redis.call('DEL', placed, RING .. lane)
  local inflight = INFLIGHT .. lane
  for _, id in ipairs(redis.call('ZRANGE', inflight, 0, -1)) do
    local claimed = redis.call('EXISTS', CLAIM .. id) == 1
    if not claimed and redis.call('EXISTS', DONE .. id) == 0 then
      local agent = redis.call('HGET', META .. id, 'agent')
      if agent then
        requeue(id, kind, agent, lane, nil, touched)
      else
        redis.call('ZREM', inflight, id)
      end
    end
  end
  if redis.call('ZCARD', inflight) == 0 then
    -- Nothing of this host is left to wait for: forget the lane, and the
    -- messages in its Celery queue (their calls are queued again above).
    redis.call('SREM', kind_key(kind, LANES), lane)
    redis.call('DEL', lane)
  end
end

local shared = shared_lane(kind)
for _, lane in ipairs(redis.call('SMEMBERS', kind_key(kind, LANES))) do
  if redis.call('EXISTS', WINDOW .. lane) == 0 then
    if is_home_lane(lane) then
      evacuate(lane)
    else
      local ring = RING .. lane
      local agent = redis.call('LPOP', ring)
      while agent do
        redis.call('HSET', kind_key(kind, WHERE), agent, shared)
        redis.call('RPUSH', RING .. shared, agent)
        agent = redis.call('LPOP', ring)
      end
    end
  end
end
-- Every live lane, after the moves above (a call may now wait on any of them).
for _, lane in ipairs(redis.call('SMEMBERS', kind_key(kind, LANES))) do
  if redis.call('EXISTS', WINDOW .. lane) == 1 then
    dispatch(kind, lane, out, max_calls)
  end
end
dispatch(kind, shared, out, max_calls)
return {out, finished}

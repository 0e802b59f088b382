-- Shared functions of the admission scripts (broker/admission.py prepends this
-- file to each script). Key names are documented once, in broker/queues.py.
-- Single Redis (or Sentinel) only: keys are built here, not passed in KEYS.

local P = 'vessel:'
-- Calls a lane may hold beyond its live capacity, so a worker that finishes a
-- call finds the next one already waiting instead of waiting for a round trip.
local SLACK = 2

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function shared_lane(kind)
  return 'vessel.' .. kind
end

-- An agent's lane: its dedicated one while a dedicated worker is live.
local function lane_for(kind, agent)
  local dedicated = 'vessel.' .. kind .. '.' .. agent
  if redis.call('EXISTS', P .. 'window:' .. dedicated) == 1 then
    return dedicated
  end
  return shared_lane(kind)
end

-- Give the agent a place at the back of its lane's ring.
local function enqueue_agent(kind, agent)
  local lane = lane_for(kind, agent)
  redis.call('HSET', P .. kind .. ':where', agent, lane)
  redis.call('RPUSH', P .. 'ring:' .. lane, agent)
  return lane
end

local function agent_limit(kind, agent)
  return tonumber(redis.call('HGET', P .. kind .. ':limit', agent) or '1')
end

-- After the agent had its turn (or lost a slot): back in the ring, blocked at
-- its limit, or out of every ring when it has nothing pending.
local function settle_agent(kind, agent)
  local pending = P .. kind .. ':pending:' .. agent
  if redis.call('LLEN', pending) == 0 then
    redis.call('HDEL', P .. kind .. ':where', agent)
    redis.call('SREM', P .. kind .. ':blocked', agent)
    return nil
  end
  local running = P .. kind .. ':running:' .. agent
  if redis.call('ZCARD', running) >= agent_limit(kind, agent) then
    redis.call('SADD', P .. kind .. ':blocked', agent)
    return nil
  end
  redis.call('SREM', P .. kind .. ':blocked', agent)
  return enqueue_agent(kind, agent)
end

-- `text` with the first `old` (plain text, not a pattern) replaced by `new`.
local function replace_once(text, old, new)
  local first, last = string.find(text, old, 1, true)
  if not first then
    return text
  end
  return string.sub(text, 1, first - 1) .. new .. string.sub(text, last + 1)
end

-- Push the call's prepared Celery message into the lane's Redis list, as kombu
-- does for a publish (broker/envelope.py): a delivery tag of its own for this
-- delivery (kombu keys its unacked bookkeeping on it; the prefix is
-- broker/queues.py's ADMISSION_TAG_PREFIX) and the lane as routing key.
local function push_envelope(id, lane, meta, fields)
  local deliveries = redis.call('HINCRBY', meta, 'deliveries', 1)
  local text = replace_once(fields[2], fields[4],
    '"delivery_tag": ' .. cjson.encode('vessel-' .. id .. '-' .. deliveries))
  text = replace_once(text, fields[3], '"routing_key": ' .. cjson.encode(lane))
  redis.call('LPUSH', lane, text)
end

-- False while a worker reports that it does not consume an envelope it pushed
-- itself (broker/fast_path.py FAST_PATH_OFF_KEY): then every call, prepared
-- or not, goes back to the caller, who publishes it with send_task.
local function fast_path_on()
  return redis.call('EXISTS', P .. 'fast-path:off') == 0
end

-- Take calls for `lane` while it has room, one per agent per turn of the ring.
-- A call with a prepared message is pushed into the lane here; the others are
-- appended as {call_id, lane, message} to `out`, for the caller to publish.
-- O(1) per call dispatched: each agent popped either yields a call or leaves the ring.
local function dispatch(kind, lane, out, max_calls)
  local window = tonumber(redis.call('GET', P .. 'window:' .. lane) or '0')
  if window <= 0 then
    return
  end
  local inflight = P .. 'inflight:' .. lane
  local free = window + SLACK - redis.call('ZCARD', inflight)
  local ring = P .. 'ring:' .. lane
  local now = now_ms()
  local taken = 0
  while free > 0 and taken < max_calls do
    local agent = redis.call('LPOP', ring)
    if not agent then
      break
    end
    local running = P .. kind .. ':running:' .. agent
    if redis.call('ZCARD', running) < agent_limit(kind, agent) then
      local id = redis.call('LPOP', P .. kind .. ':pending:' .. agent)
      if id then
        local message = redis.call('GET', P .. 'call:' .. id)
        local meta = P .. 'meta:' .. id
        if message then
          local fields = redis.call('HMGET', meta, 'lease_ms', 'envelope', 'route', 'tag')
          local lease = tonumber(fields[1] or '60000')
          local expiry = now + lease
          redis.call('ZADD', running, expiry, id)
          redis.call('ZADD', inflight, expiry, id)
          redis.call('ZADD', P .. kind .. ':leases', expiry, id)
          redis.call('HSET', meta, 'lane', lane)
          if fields[2] and fields[3] and fields[4] and fast_path_on() then
            push_envelope(id, lane, meta, fields)
          else
            out[#out + 1] = {id, lane, message}
          end
          free = free - 1
          taken = taken + 1
        else
          -- The record expired (queued longer than result_expires): drop it.
          redis.call('DEL', meta)
        end
      end
    end
    settle_agent(kind, agent)
  end
end

-- Dispatch the lane of a call and the current lane of its agent.
local function dispatch_for(kind, agent, lane, out, max_calls)
  dispatch(kind, lane, out, max_calls)
  local where = redis.call('HGET', P .. kind .. ':where', agent)
  if where and where ~= lane then
    dispatch(kind, where, out, max_calls)
  end
end

-- Free the call's slot and lane place and forget its records. Returns kind, agent, lane, or nil when
-- the call holds no slot (already released, or never dispatched).
local function release(id)
  local meta = P .. 'meta:' .. id
  local fields = redis.call('HMGET', meta, 'kind', 'agent', 'lane')
  local kind, agent, lane = fields[1], fields[2], fields[3]
  if not kind or not lane then
    return nil
  end
  local removed = redis.call('ZREM', P .. kind .. ':running:' .. agent, id)
  redis.call('ZREM', P .. 'inflight:' .. lane, id)
  redis.call('ZREM', P .. kind .. ':leases', id)
  -- The claim is no longer needed: `done` turns every later delivery away.
  redis.call('DEL', meta, P .. 'call:' .. id, P .. 'claim:' .. id)
  if removed == 1 and redis.call('SISMEMBER', P .. kind .. ':blocked', agent) == 1 then
    settle_agent(kind, agent)
  end
  return kind, agent, lane
end

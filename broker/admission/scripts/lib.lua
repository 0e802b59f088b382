-- Shared functions of the admission scripts (broker/admission/lua.py puts the
-- `local` constants of broker/admission/keys.py, then this file, before each
-- script). Key names are documented once, in broker/admission/keys.py.
-- Single Redis (or Sentinel) only: keys are built here, not passed in KEYS.
-- `vessel:<kind>:<name>[:<rest>]`: a key of one worker kind (keys.py kind_key).
local function kind_key(kind, name, rest)
  local key = P .. kind .. SEP .. name
  if rest then
    return key .. SEP .. rest
  end
  return key
end
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function shared_lane(kind)
  return LANE_PREFIX .. kind
end

-- An agent's lane: its dedicated one while a dedicated worker is live.
local function lane_for(kind, agent)
  local dedicated = LANE_PREFIX .. kind .. AGENT_SEPARATOR .. agent
  if redis.call('EXISTS', WINDOW .. dedicated) == 1 then
    return dedicated
  end
  return shared_lane(kind)
end

-- Give the agent a place at the back of its lane's ring.
local function enqueue_agent(kind, agent)
  local lane = lane_for(kind, agent)
  redis.call('HSET', kind_key(kind, WHERE), agent, lane)
  redis.call('RPUSH', RING .. lane, agent)
  return lane
end

local function agent_limit(kind, agent)
  return tonumber(redis.call('HGET', kind_key(kind, LIMIT), agent)) or UNKNOWN_AGENT_LIMIT
end

-- Home lanes (broker/queues.py): `<lane>@<host>`, consumed only by the workers
-- of one host (one workspace root), where the turns homed there run.
local function is_home_lane(lane)
  return string.find(lane, HOME_SEPARATOR, 1, true) ~= nil
end

-- The lane a home lane belongs to (`vessel.sandbox@h` -> `vessel.sandbox`).
local function base_of(lane)
  local at = string.find(lane, HOME_SEPARATOR, 1, true)
  if at then
    return string.sub(lane, 1, at - 1)
  end
  return lane
end

-- The agent's queued calls for its base lane (home nil) or for one home lane.
local function pending_key(kind, agent, home)
  if home then
    return kind_key(kind, PENDING, agent) .. SEP .. home
  end
  return kind_key(kind, PENDING, agent)
end

-- A queue ('base' or a home lane) of the agent waits at its limit.
local function park(kind, agent, spec)
  redis.call('SADD', kind_key(kind, BLOCKED), agent)
  redis.call('SADD', kind_key(kind, PARKED, agent), spec)
end

local function unpark(kind, agent, spec)
  local parked = kind_key(kind, PARKED, agent)
  redis.call('SREM', parked, spec)
  if redis.call('SCARD', parked) == 0 then
    redis.call('SREM', kind_key(kind, BLOCKED), agent)
  end
end

-- After the agent had its turn on its base lane (or lost a slot): back in the
-- ring, parked at its limit, or out of every ring when it has nothing pending.
local function settle_agent(kind, agent)
  local pending = kind_key(kind, PENDING, agent)
  if redis.call('LLEN', pending) == 0 then
    redis.call('HDEL', kind_key(kind, WHERE), agent)
    unpark(kind, agent, 'base')
    return nil
  end
  local running = kind_key(kind, RUNNING, agent)
  if redis.call('ZCARD', running) >= agent_limit(kind, agent) then
    park(kind, agent, 'base')
    return nil
  end
  unpark(kind, agent, 'base')
  return enqueue_agent(kind, agent)
end

-- The same for the agent's queue on a home lane (`vessel:placed:<lane>` holds
-- the agents with a place there, in its ring or parked).
local function settle_home(kind, agent, lane)
  if redis.call('LLEN', pending_key(kind, agent, lane)) == 0 then
    redis.call('SREM', PLACED .. lane, agent)
    unpark(kind, agent, lane)
    return
  end
  if redis.call('ZCARD', kind_key(kind, RUNNING, agent)) >= agent_limit(kind, agent) then
    park(kind, agent, lane)
    return
  end
  unpark(kind, agent, lane)
  redis.call('RPUSH', RING .. lane, agent)
end

-- Give the agent's queue on a home lane a place, unless it has one.
local function place_home(kind, agent, lane)
  if redis.call('SADD', PLACED .. lane, agent) == 1 then
    settle_home(kind, agent, lane)
  end
end

local function settle_queue(kind, agent, lane)
  if is_home_lane(lane) then
    settle_home(kind, agent, lane)
  else
    settle_agent(kind, agent)
  end
end

-- A slot of the agent came free: its parked queues take their places again.
-- Appends the home lanes that got one to `touched` (to dispatch them).
local function unblock(kind, agent, touched)
  if redis.call('SISMEMBER', kind_key(kind, BLOCKED), agent) == 0 then
    return
  end
  for _, spec in ipairs(redis.call('SMEMBERS', kind_key(kind, PARKED, agent))) do
    if spec == 'base' then
      settle_agent(kind, agent)
    else
      settle_home(kind, agent, spec)
      touched[#touched + 1] = spec
    end
  end
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
-- TAG_PREFIX, keys.py's ADMISSION_TAG_PREFIX) and the lane as routing key.
local function push_envelope(id, lane, meta, fields)
  local deliveries = redis.call('HINCRBY', meta, 'deliveries', 1)
  local text = replace_once(fields[2], fields[4],
    '"delivery_tag": ' .. cjson.encode(TAG_PREFIX .. id .. '-' .. deliveries))
  text = replace_once(text, fields[3], '"routing_key": ' .. cjson.encode(lane))
  redis.call('LPUSH', lane, text)
end

-- False while a worker reports that it does not consume an envelope it pushed
-- itself (FAST_PATH_OFF_KEY, broker/fast_path.py): then every call, prepared
-- or not, goes back to the caller, who publishes it with send_task.
local function fast_path_on()
  return redis.call('EXISTS', FAST_PATH_OFF_KEY) == 0
end

-- Take calls for `lane` while it has room, one per agent per turn of the ring.
-- A call with a prepared message is pushed into the lane here; the others are
-- appended as {call_id, lane, message} to `out`, for the caller to publish.
-- O(1) per call dispatched: each agent popped either yields a call or leaves the ring.
local function dispatch(kind, lane, out, max_calls)
  local window = tonumber(redis.call('GET', WINDOW .. lane) or '0')
  if window <= 0 then
    return
  end
  local inflight = INFLIGHT .. lane
  local free = window + SLACK - redis.call('ZCARD', inflight)
  local ring = RING .. lane
  local home = nil
  if is_home_lane(lane) then
    home = lane
  end
  local now = now_ms()
  local taken = 0
  while free > 0 and taken < max_calls do
    local agent = redis.call('LPOP', ring)
    if not agent then
      break
    end
    local running = kind_key(kind, RUNNING, agent)
    if redis.call('ZCARD', running) < agent_limit(kind, agent) then
      local id = redis.call('LPOP', pending_key(kind, agent, home))
      if id then
        local message = redis.call('GET', CALL .. id)
        local meta = META .. id
        if message then
          local fields = redis.call('HMGET', meta, 'lease_ms', 'envelope', 'route', 'tag')
          local lease = tonumber(fields[1]) or DEFAULT_LEASE_MS
          local expiry = now + lease
          redis.call('ZADD', running, expiry, id)
          redis.call('ZADD', inflight, expiry, id)
          redis.call('ZADD', kind_key(kind, LEASES), expiry, id)
          redis.call('HSET', meta, 'lane', lane)
          if home then
            redis.call('HDEL', meta, 'queue')
          end
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
    settle_queue(kind, agent, lane)
  end
end

-- Dispatch the lane of a call, the current lane of its agent and the home
-- lanes in `touched` (where the agent's parked queues just got their places).
local function dispatch_for(kind, agent, lane, out, max_calls, touched)
  dispatch(kind, lane, out, max_calls)
  local where = redis.call('HGET', kind_key(kind, WHERE), agent)
  if where and where ~= lane then
    dispatch(kind, where, out, max_calls)
  end
  for _, home in ipairs(touched or {}) do
    if home ~= lane then
      dispatch(kind, home, out, max_calls)
    end
  end
end

-- Free the call's slot and lane place and forget its records. Returns kind,
-- agent, lane and the home lanes to dispatch, or nil when the call holds no
-- slot (already released, or never dispatched).
local function release(id)
  local meta = META .. id
  local fields = redis.call('HMGET', meta, 'kind', 'agent', 'lane')
  local kind, agent, lane = fields[1], fields[2], fields[3]
  if not kind or not lane then
    return nil
  end
  local removed = redis.call('ZREM', kind_key(kind, RUNNING, agent), id)
  redis.call('ZREM', INFLIGHT .. lane, id)
  redis.call('ZREM', kind_key(kind, LEASES), id)
  -- The claim is no longer needed: `done` turns every later delivery away.
  redis.call('DEL', meta, CALL .. id, CLAIM .. id)
  local touched = {}
  if removed == 1 then
    unblock(kind, agent, touched)
  end
  return kind, agent, lane, touched
end

-- Put a dispatched call back in a queue (head first): its slot and lane place
-- are freed. `home` nil: the agent's base queue; else that home lane's queue.
local function requeue(id, kind, agent, lane, home, touched)
  local meta = META .. id
  redis.call('ZREM', kind_key(kind, RUNNING, agent), id)
  redis.call('ZREM', INFLIGHT .. lane, id)
  redis.call('ZREM', kind_key(kind, LEASES), id)
  redis.call('HDEL', meta, 'lane')
  redis.call('LPUSH', pending_key(kind, agent, home), id)
  if home then
    redis.call('HSET', meta, 'queue', home)
    place_home(kind, agent, home)
    touched[#touched + 1] = home
  else
    redis.call('HDEL', meta, 'queue')
    if not redis.call('HGET', kind_key(kind, WHERE), agent) then
      enqueue_agent(kind, agent)
    end
  end
  unblock(kind, agent, touched)
end

-- Turn affinity (broker/admission/__init__.py, "Turns and homes"). A turn's home:
-- hash vessel:home:<agent>:<turn> with `lane` (the home lane) and `lost` ('1':
-- the next call must say the workspace was lost), expiring with the workspace.
local function home_key(agent, turn)
  return HOME .. agent .. SEP .. turn
end

-- The turn's home lane if it is alive (its host's window exists), else nil.
local function live_home(agent, turn)
  local home = redis.call('HGET', home_key(agent, turn), 'lane')
  if home and redis.call('EXISTS', WINDOW .. home) == 1 then
    return home
  end
  return nil
end

-- A worker whose home lane is `mine` received a call (for_call) or a workspace
-- operation of the turn; `here` is '1' if the turn's folder exists on its host,
-- `seen` '1' if the client had seen the turn homed before. Returns the home
-- lane, and what happened to the workspace: 0 nothing; 1 it was lost earlier
-- (the note is still owed to the model); 2 it is lost now: the home died, or
-- Redis no longer knows a home the client saw, and `mine` takes the turn with
-- an empty folder. A home alive elsewhere is returned as is (lost 0).
local function take_home(agent, turn, mine, ttl, here, seen, for_call)
  local key = home_key(agent, turn)
  local fields = redis.call('HMGET', key, 'lane', 'lost')
  local home, owed = fields[1], fields[2]
  if home and home ~= mine and redis.call('EXISTS', WINDOW .. home) == 1 then
    return home, 0
  end
  local lost = 0
  if home == mine then
    if owed == '1' then
      lost = 1
    end
  elseif home then
    lost = 2  -- its host is gone (a folder here is an older stay's: emptied)
  elseif seen == '1' and here ~= '1' then
    lost = 2  -- Redis lost the home; had it been this host, the folder would be here
  end
  local keep = '0'
  if lost > 0 and not for_call then
    keep = '1'  -- an operation reports it; the next call still tells the model
  end
  if home ~= mine or owed ~= keep then
    redis.call('HSET', key, 'lane', mine, 'lost', keep)
  end
  redis.call('EXPIRE', key, ttl)
  return mine, lost
end

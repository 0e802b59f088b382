-- A worker says it is alive with its capacity on each of its lanes, then
-- dispatches them. ARGV: kind, hostname, ttl_ms, max_calls, lane1, cap1, lane2, cap2, ...
-- A capacity of 0 takes the worker off the lane (it is shutting down).
local kind, host, ttl, max_calls = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local now = now_ms()
local out = {}
for i = 5, #ARGV, 2 do
  local lane, capacity = ARGV[i], tonumber(ARGV[i + 1])
  local workers, alive = WORKERS .. lane, ALIVE .. lane
  if capacity > 0 then
    redis.call('HSET', workers, host, capacity)
    redis.call('ZADD', alive, now + ttl, host)
  else
    redis.call('HDEL', workers, host)
    redis.call('ZREM', alive, host)
  end
  for _, gone in ipairs(redis.call('ZRANGEBYSCORE', alive, '-inf', now)) do
    redis.call('HDEL', workers, gone)
    redis.call('ZREM', alive, gone)
  end
  local window = 0
  for _, value in ipairs(redis.call('HVALS', workers)) do
    window = window + tonumber(value)
  end
  if window > 0 then
    -- The window vanishes with the last heartbeat: no live worker, no dispatch.
    redis.call('SET', WINDOW .. lane, window, 'PX', ttl)
  else
    redis.call('DEL', WINDOW .. lane)
  end
  if lane ~= shared_lane(kind) then
    redis.call('SADD', kind_key(kind, LANES), lane)
  end
  dispatch(kind, lane, out, max_calls)
end
return out

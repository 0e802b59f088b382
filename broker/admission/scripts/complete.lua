-- A call's result is ready: mark the call done, write its result where the
-- Celery result backend keeps it, free its slot and dispatch, in one script.
-- Used when the result backend is this same Redis (broker/admission/finish.py: finish_call);
-- otherwise the worker runs `finish`, stores through Celery, then `release`.
-- ARGV: call_id, hostname, done_ttl_s, result_key, result_value, result_ttl_s (0: none), max_calls
-- Returns {stored, dispatched}: stored is 1 when this result was written, 0 when
-- the call had one already (nothing is written). The slot is freed either way.
local id, host, done_ttl = ARGV[1], ARGV[2], tonumber(ARGV[3])
local result_key, result_value, result_ttl = ARGV[4], ARGV[5], tonumber(ARGV[6])
local stored = 0
if redis.call('SET', DONE .. id, host, 'NX', 'EX', done_ttl) then
  redis.call('DEL', CANCEL .. id)
  -- What Celery's Redis backend does for a result: SET (with its expiry) and
  -- PUBLISH on the key's channel, where waiting clients are subscribed.
  if result_ttl > 0 then
    redis.call('SET', result_key, result_value, 'EX', result_ttl)
  else
    redis.call('SET', result_key, result_value)
  end
  redis.call('PUBLISH', result_key, result_value)
  stored = 1
end
local kind, agent, lane, touched = release(id)
local out = {}
if kind then
  dispatch_for(kind, agent, lane, out, tonumber(ARGV[7]), touched)
end
return {stored, out}

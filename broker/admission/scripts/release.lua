-- A call finished (its result is stored): free its slot and dispatch.
-- ARGV: call_id, max_calls
local kind, agent, lane, touched = release(ARGV[1])
local out = {}
if kind then
  dispatch_for(kind, agent, lane, out, tonumber(ARGV[2]), touched)
end
return out

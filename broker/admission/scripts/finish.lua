-- The first result of a call wins: mark it done, once.
-- ARGV: call_id, hostname, ttl_s. Returns 1 if this caller stores the result.
local id = ARGV[1]
if not redis.call('SET', DONE .. id, ARGV[2], 'NX', 'EX', tonumber(ARGV[3])) then
  return 0
end
redis.call('DEL', CANCEL .. id)
return 1

-- A worker received a workspace operation of a turn: is it the turn's home?
-- ARGV: agent, turn, mine (the worker's home lane), home_ttl_s, here, seen
-- (see take_home in lib.lua). Returns {home lane, lost}: the
-- operation runs here when the home lane is `mine`, else it goes there.
local home, lost = take_home(ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5], ARGV[6], false)
return {home, lost}

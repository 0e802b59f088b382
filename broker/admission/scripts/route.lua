-- Where a workspace operation of a turn goes. ARGV: kind, agent, turn.
-- Returns the turn's home lane while its host lives, else the agent's lane
-- (the first host to take the operation becomes the turn's home).
local kind, agent, turn = ARGV[1], ARGV[2], ARGV[3]
local home = live_home(agent, turn)
if home then
  return home
end
return lane_for(kind, agent)

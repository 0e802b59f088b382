-- The worker's start-up self-test (workers/worker.py): push a probe envelope
-- into a private queue exactly as dispatch pushes a call's (push_envelope).
-- ARGV: probe id, queue, envelope, route, tag
local id, queue = ARGV[1], ARGV[2]
local meta = PROBE .. id
push_envelope(id, queue, meta, {false, ARGV[3], ARGV[4], ARGV[5]})
redis.call('DEL', meta)
return 1

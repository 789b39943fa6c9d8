-- sink_record.lua: the load test sink's record of one applied message, in one call.
--
-- KEYS[1] applied counts by idempotency key (hash)   KEYS[2] applied log (list)
-- ARGV: 1 idempotency key, 2 log line, 3 seconds to keep the record, 4 most entries kept
--   (a run that never ends, e.g. the default run id, must not grow without bound:
--   past the cap the oldest log lines go and new keys are counted in '_overflow')
--
-- The record is the load test's own verification, not the simulated work: it
-- goes through the same lean path as the platform's scripts (tools.sink._call_lean),
-- so that it weighs on the measurement as little as it can.

local cap = tonumber(ARGV[4])
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 or redis.call('HLEN', KEYS[1]) < cap then
  redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
else
  redis.call('HINCRBY', KEYS[1], '_overflow', 1)
end
redis.call('RPUSH', KEYS[2], ARGV[2])
redis.call('LTRIM', KEYS[2], -cap, -1)
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[3]))
redis.call('EXPIRE', KEYS[2], tonumber(ARGV[3]))
return 1

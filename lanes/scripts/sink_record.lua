-- sink_record.lua: the load test sink's record of one applied message, in one call.
--
-- KEYS[1] applied counts by idempotency key (hash)   KEYS[2] applied log (list)
-- ARGV: 1 idempotency key, 2 log line, 3 seconds to keep the record
--
-- The record is the load test's own verification, not the simulated work: it
-- goes through the same lean path as the platform's scripts (lanes.scripts.call),
-- so that it weighs on the measurement as little as it can.

redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
redis.call('RPUSH', KEYS[2], ARGV[2])
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[3]))
redis.call('EXPIRE', KEYS[2], tonumber(ARGV[3]))
return 1

-- sink_record_batch.lua: the batched load test sink's record of a batch's applied messages, in one call.
--
-- KEYS[1] applied counts by idempotency key (hash)   KEYS[2] applied log (list)
-- KEYS[3] handler calls of the run (a counter: one per batch; the load test reports items per call)
-- ARGV: 1 seconds to keep the record, 2 most entries kept, then (idempotency key, log line) pairs
--
-- The same record as sink_record.lua's, item by item (same cap, same '_overflow'),
-- so the load test's checker reads it unchanged; the log lines go in one RPUSH.

local ttl, cap = tonumber(ARGV[1]), tonumber(ARGV[2])
local lines = {}
for i = 3, #ARGV, 2 do
  if redis.call('HEXISTS', KEYS[1], ARGV[i]) == 1 or redis.call('HLEN', KEYS[1]) < cap then
    redis.call('HINCRBY', KEYS[1], ARGV[i], 1)
  else
    redis.call('HINCRBY', KEYS[1], '_overflow', 1)
  end
  lines[#lines + 1] = ARGV[i + 1]
end
if #lines > 0 then
  redis.call('RPUSH', KEYS[2], unpack(lines))
  redis.call('LTRIM', KEYS[2], -cap, -1)
  redis.call('EXPIRE', KEYS[1], ttl)
  redis.call('EXPIRE', KEYS[2], ttl)
end
redis.call('INCR', KEYS[3])
redis.call('EXPIRE', KEYS[3], ttl)
return #lines

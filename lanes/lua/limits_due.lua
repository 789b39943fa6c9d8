-- limits_due.lua: hand waiting tasks on where a limit admits them again (a batch).
--
-- KEYS[1] due instances (zset: base -> ms)   KEYS[2] leases
-- KEYS[3] metrics totals   KEYS[4] metrics minute
-- ARGV: 1 now ms, 2 most instances, 3 queued lease ms, 4 limits key prefix,
--   5 lane key prefix, 6 most tasks published per instance
-- Returns the number of instances drained.
--
-- An instance is due when its bucket has a token again, its Retry-After pause
-- ends, a drain stopped at its budget, or its definition changed. Draining
-- publishes its waiting heads in order while every limit of each admits it; a
-- head refused by one of its other limits moves to that one's waiting set.

local now = tonumber(ARGV[1])
lim_setup(ARGV[4], ARGV[5], KEYS[3], KEYS[4], now, KEYS[2], now + tonumber(ARGV[3]))
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
for _, base in ipairs(due) do
  redis.call('ZREM', KEYS[1], base)
  lim_drain(base, tonumber(ARGV[6]))
end
return #due

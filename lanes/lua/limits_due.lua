-- limits_due.lua: hand waiting tasks on where a limit admits them again (a batch).
--
-- KEYS: due (instances, zset: base -> ms), leases, metrics_total, metrics_minute
-- ARGV: now_ms, batch (most instances), queued_lease_ms, limit_prefix, lane_prefix,
--   per_instance (most tasks published per instance)
-- Returns the number of instances drained.
--
-- An instance is due when its bucket has a token again, its Retry-After pause
-- ends, a drain stopped at its budget, or its definition changed. Draining
-- publishes its waiting heads in order while every limit of each admits it; a
-- head refused by one of its other limits moves to that one's waiting set.

local due_key, leases, metrics_total, metrics_minute = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local now, batch, queued_lease_ms, limit_prefix, lane_prefix, per_instance =
  tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4], ARGV[5], tonumber(ARGV[6])

lim_setup(limit_prefix, lane_prefix, metrics_total, metrics_minute, now, leases, now + queued_lease_ms)
local due = redis.call('ZRANGEBYSCORE', due_key, '-inf', now, 'LIMIT', 0, batch)
for _, base in ipairs(due) do
  redis.call('ZREM', due_key, base)
  lim_drain(base, per_instance)
end
return #due

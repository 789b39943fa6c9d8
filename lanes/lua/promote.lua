-- promote.lua: move due retries, and tasks sent for later (st 'scheduled',
-- admit.lua), from a lane's delayed set onto the lane.
--
-- KEYS: delayed (the lane's delayed set), leases, metrics_total, metrics_minute
-- ARGV: now_ms, batch (most to move), queued_lease_ms, limit_prefix, lane_prefix
-- Returns the number of messages published (a retry with limits passes their
-- gate, and may wait on a limit instead).

local delayed, leases, metrics_total, metrics_minute = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local now, batch, queued_lease_ms, limit_prefix, lane_prefix =
  tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4], ARGV[5]

lim_setup(limit_prefix, lane_prefix, metrics_total, metrics_minute, now, leases, now + queued_lease_ms)
local due = redis.call('ZRANGEBYSCORE', delayed, '-inf', now, 'LIMIT', 0, batch)
local moved = 0
for _, record in ipairs(due) do
  redis.call('ZREM', delayed, record)
  local f = redis.call('HMGET', record, 'st', 'lim', 'lane', 'kp')
  if f[1] == 'retry' or f[1] == 'scheduled' then
    if not f[2] then
      publish_record(record, leases, now + queued_lease_ms)
      moved = moved + 1
    elseif gate_publish(record, f[2], f[3], f[4]) then
      moved = moved + 1
    end
  end
end
return moved

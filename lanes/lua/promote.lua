-- promote.lua: move due retries, and tasks sent for later (st 'scheduled',
-- admit.lua), from a lane's delayed set onto the lane.
--
-- KEYS[1] lane delayed set   KEYS[2] leases
-- ARGV: 1 now ms, 2 most to move, 3 queued lease ms, 4 limits key prefix,
--   5 lane key prefix
-- KEYS[3] metrics totals   KEYS[4] metrics minute
-- Returns the number of messages published (a retry with limits passes their
-- gate, and may wait on a limit instead).

local now = tonumber(ARGV[1])
lim_setup(ARGV[4], ARGV[5], KEYS[3], KEYS[4], now, KEYS[2], now + tonumber(ARGV[3]))
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
local moved = 0
for _, record in ipairs(due) do
  redis.call('ZREM', KEYS[1], record)
  local f = redis.call('HMGET', record, 'st', 'lim', 'lane', 'kp')
  if f[1] == 'retry' or f[1] == 'scheduled' then
    if not f[2] then
      publish_record(record, KEYS[2], now + tonumber(ARGV[3]))
      moved = moved + 1
    elseif gate_publish(record, f[2], f[3], f[4]) then
      moved = moved + 1
    end
  end
end
return moved

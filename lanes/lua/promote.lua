-- promote.lua: move due retries from a lane's delayed set onto the lane.
--
-- KEYS[1] lane delayed set   KEYS[2] leases
-- ARGV: 1 now ms, 2 most to move, 3 queued lease ms
-- Returns the number of messages published.

local now = tonumber(ARGV[1])
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
local moved = 0
for _, record in ipairs(due) do
  redis.call('ZREM', KEYS[1], record)
  if redis.call('HGET', record, 'st') == 'retry' then
    publish_record(record, KEYS[2], now + tonumber(ARGV[3]))
    moved = moved + 1
  end
end
return moved

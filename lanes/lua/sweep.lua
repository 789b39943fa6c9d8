-- sweep.lua: republish tasks whose lease expired (their worker or publisher died,
-- or a finished task's worker died before storing its result row).
--
-- KEYS[1] leases   KEYS[2] deadlines of waiting tasks (a running task republished waits again)
-- ARGV: 1 now ms, 2 most to handle, 3 queued lease ms, 4 delayed-set key prefix,
--   5 kombu's unacked hash key, 6 how deep to search a lane list for a copy
-- Returns {republished, forgotten, still_waiting}.
--
-- A republished copy may meet an earlier copy still in the broker; execution
-- claims (start.lua) let only one of them run, so over-publishing is safe and
-- a lost publish is not.
--
-- A queued task whose lease ran out is republished only if its copy is no
-- longer in the broker: a worker pops a message (BRPOP) before it claims it,
-- and the broker keeps no copy of a platform message a worker holds
-- (lanes.transport), so a worker killed in between loses it. The queued lease
-- can then be short (the fault campaign found a chat blocked for the whole
-- lease), without every task that merely waits long in a backlog getting copies.

local now = tonumber(ARGV[1])
local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
local republished, forgotten, waiting = 0, 0, 0
local window = tonumber(ARGV[6])
for _, record in ipairs(expired) do
  local f = redis.call('HMGET', record, 'st', 'lane')
  local st = f[1]
  local finished = st == 'done' or st == 'dead'
  if (st == 'queued' or finished) and still_in_broker(record, ARGV[5], window) ~= false then
    -- A copy is still on its way (waiting, or sent to store a finished task's row): look again later.
    redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), record)
    waiting = waiting + 1
  elseif finished or st == 'queued' or st == 'running' or st == 'retry' then
    if st == 'retry' then redis.call('ZREM', ARGV[4] .. f[2], record) end
    -- A finished record was never settled (its worker died before storing the
    -- result row): it keeps its state, so its copy only stores the row (start.lua).
    if publish_record(record, KEYS[1], now + tonumber(ARGV[3]), finished and st or nil) then
      republished = republished + 1
      local deadline = not finished and KEYS[2] and redis.call('HGET', record, 'dl')
      if deadline then redis.call('ZADD', KEYS[2], tonumber(deadline), record) end
    else
      redis.call('ZREM', KEYS[1], record)
      forgotten = forgotten + 1
    end
  else
    redis.call('ZREM', KEYS[1], record)
    forgotten = forgotten + 1
  end
end
return {republished, forgotten, waiting}

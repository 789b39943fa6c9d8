-- sweep.lua: republish tasks whose lease expired (a stopped worker's claim, a
-- finished task never settled, a lost publish), without reading the backlog.
--
-- KEYS: leases, deadlines (of waiting tasks: a running task republished waits again; optional)
-- ARGV: now_ms, batch (most to handle), queued_lease_ms, delayed_prefix (of a lane's delayed set),
--   lane_prefix (a running task republished counts as waiting again, _lib.lua)
-- Returns {republished, forgotten, parked, redis_commands}.
--
-- A republished copy may meet an earlier copy still in the broker; execution
-- claims (start.lua) let only one of them run, so over-publishing is safe and
-- a lost publish is not.
--
-- A dead worker's claims and popped messages are reclaimed from its held and
-- in-hand sets as soon as its liveness is gone (reclaim.lua); what reaches the
-- lease here is what that cannot see: a claim of a process that still exists
-- (stopped: only its lease bounds how long it may still act), a finished record
-- its live worker could not settle, a message lost from the broker.
--
-- A queued record has a queued lease once a pop took its copy (pop_more.lua: popped, not claimed) or
-- something published it again (publish_record: a retry, a hand-over, a republish); admission writes
-- none, the copy waiting in its list needing none (audit.lua's walk of the waiting tasks finds one lost
-- from an empty list). A queued record whose lease ran out is never searched for in its lane list (that
-- cost grew with the backlog): if the list is empty its
-- copy is gone (popped, or lost) and it is republished; otherwise it is
-- waiting there and its lease is parked ('+inf': looked at once, then never
-- again while it waits; once popped, the popping worker's in-hand set and
-- then its claim cover it, and its deadline bounds it in any case).

local leases, deadlines = KEYS[1], KEYS[2]
local now, batch, queued_lease_ms, delayed_prefix, lane_prefix =
  tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4], ARGV[5]

local expired = redis.call('ZRANGEBYSCORE', leases, '-inf', now, 'LIMIT', 0, batch)
local republished, forgotten, parked, commands = 0, 0, 0, 1
for _, record in ipairs(expired) do
  local f = redis.call('HMGET', record, 'st', 'lane', 'q', 'eta')
  commands = commands + 1
  local st = f[1]
  local finished = st == 'done' or st == 'dead' or st == 'cancelled'
  local waiting = false
  if st == 'queued' then
    waiting = redis.call('LLEN', f[3]) > 0
    commands = commands + 1
  end
  if waiting then
    redis.call('ZADD', leases, '+inf', record)
    commands = commands + 1
    parked = parked + 1
  elseif st == 'retry' or st == 'scheduled' then
    -- Due now, not published here: promotion publishes it through its limits'
    -- gate (a retry's slots were given back when it was parked). A task sent for
    -- later is leased until its due time plus the queued lease, so it is due by
    -- now; never before its due time in any case.
    local at = now
    if st == 'scheduled' then at = math.max(now, tonumber(f[4]) or now) end
    redis.call('ZADD', delayed_prefix .. f[2], at, record)
    redis.call('ZADD', leases, at + queued_lease_ms, record)
    commands = commands + 2
    republished = republished + 1
  elseif finished or st == 'queued' or st == 'running' then
    -- A finished record was never settled (its worker died before storing the
    -- result row): it keeps its state, so its copy only stores the row (start.lua).
    if publish_record(record, leases, now + queued_lease_ms, finished and st or nil) then
      republished = republished + 1
      commands = commands + 7
      local deadline = not finished and deadlines and redis.call('HGET', record, 'dl')
      if deadline then commands = commands + waiting_add(deadlines, record, tonumber(deadline), lane_prefix, f[2]) end
    else
      redis.call('ZREM', leases, record)
      forgotten = forgotten + 1
    end
  else
    redis.call('ZREM', leases, record)
    commands = commands + 1
    forgotten = forgotten + 1
  end
end
return {republished, forgotten, parked, commands}

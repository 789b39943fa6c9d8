-- reclaim.lua: hand on at once what dead worker processes held (docs/liveness.md).
--
-- KEYS: procs (live processes, zset: host:pid -> liveness expiry ms), vouched (zset:
--   host:pid -> until ms; pid seen alive on its host), leases, deadlines (of waiting tasks)
-- ARGV: now_ms, batch (most processes per call), held_prefix (of a process's held set),
--   in_hand_prefix (of its in-hand set), queued_lease_ms, lane_prefix (a claim handed back
--   waits again: its lane's waiting count rises with the deadlines set, _lib.lua)
-- Returns {processes_reclaimed, records_examined, republished, redis_commands}.
--
-- Cost: one ZRANGEBYSCORE on the process list, then per dead process O(what it
-- held): its in-hand set (messages its main process popped and had not acked)
-- and its held set (its claims, running or finished and not yet settled). The
-- backlog is never read: a task waiting in a lane list is in no such set.
--
-- A popped-but-unclaimed message (state still 'queued') is republished as soon
-- as its process's own beat is gone, stopped or not: a claim lets one copy run,
-- so a stopped process that wakes with it changes nothing. A claim is taken
-- over only when nobody vouches for the process: a stopped process may wake
-- and finish its effect, and only its lease bounds that (sweep.lua then).

local procs, vouched_set, leases, deadlines = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local now, batch, held_prefix, in_hand_prefix, queued_lease_ms, lane_prefix =
  tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3], ARGV[4], tonumber(ARGV[5]), ARGV[6]

local lease_until = now + queued_lease_ms
local dead = redis.call('ZRANGEBYSCORE', procs, '-inf', now, 'LIMIT', 0, batch)
local reclaimed, examined, republished, commands = 0, 0, 0, 1

for _, proc in ipairs(dead) do
  local in_hand_key = in_hand_prefix .. proc
  for _, record in ipairs(redis.call('SMEMBERS', in_hand_key)) do
    examined = examined + 1
    commands = commands + 1
    if redis.call('HGET', record, 'st') == 'queued' and publish_record(record, leases, lease_until) then
      republished = republished + 1
      commands = commands + 6
    end
  end
  redis.call('DEL', in_hand_key)
  commands = commands + 3
  local vouched = tonumber(redis.call('ZSCORE', vouched_set, proc) or '0')
  if vouched > now then
    -- Alive but silent (stopped, starved): its claims wait for their leases; look again then.
    redis.call('ZADD', procs, vouched, proc)
    commands = commands + 1
  else
    local held_key = held_prefix .. proc
    local mine = proc .. ':'
    for _, record in ipairs(redis.call('SMEMBERS', held_key)) do
      examined = examined + 1
      commands = commands + 1
      local f = redis.call('HMGET', record, 'st', 'own', 'lane', 'dl')
      local st = f[1]
      local finished = st == 'done' or st == 'dead' or st == 'cancelled'
      if (st == 'running' and string.sub(f[2] or '', 1, #mine) == mine) or finished then
        -- A finished record keeps its state: its copy only stores the result row (start.lua).
        if publish_record(record, leases, lease_until, finished and st or nil) then
          republished = republished + 1
          commands = commands + 6
          if not finished and f[4] then
            commands = commands + waiting_add(deadlines, record, tonumber(f[4]), lane_prefix, f[3])
          end
        end
      end
    end
    redis.call('DEL', held_key)
    redis.call('ZREM', procs, proc)
    redis.call('ZREM', vouched_set, proc)
    commands = commands + 4
    reclaimed = reclaimed + 1
  end
end
return {reclaimed, examined, republished, commands}

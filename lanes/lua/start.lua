-- start.lua: claim a task's execution before its handler runs.
--
-- KEYS[1] task record   KEYS[2] leases   KEYS[3] config version
-- KEYS[4] chat queue or record   KEYS[5] the task's tombstone (written by finish.lua)
-- KEYS[6] deadlines of waiting tasks (a claimed task leaves it: its worker keeps the deadline)
-- KEYS[7] live processes (zset: host:pid -> liveness expiry ms)
-- KEYS[8] the claiming process's held set (reclaim.lua reads it once the process is dead)
-- ARGV: 1 task id, 2 attempt carried by the message, 3 owner (host:pid:thread),
--   4 now ms, 5 lease ms, 6 max deliveries, 7 owner known dead ('' if none),
--   8 the claiming process (host:pid), 9 liveness ms (a process claiming before its
--   first beat registers with it; 0 once it has beaten), 10 lane key prefix (the
--   lane's waiting count drops with the claim, _lib.lua)
-- Returns {'run', deliveries, config_version} | {'finished', 'done|<result>' or
--   'dead|null' or 'cancelled|<detail JSON>' (cancel.lua: a cancelled copy is dropped, never run)} | {'gone'} (never accepted, or finished long ago) | {'stale'}
--   | {'busy', owner} | {'nothead'} | {'poison', deliveries}

local f = redis.call('HMGET', KEYS[1], 'st', 'att', 'own', 'chat', 'res', 'lane', 'dlv')
local st = f[1]
if not st then
  local tomb = redis.call('GET', KEYS[5])
  if tomb then return {'finished', tomb} end
  return {'gone'}
end
if st == 'done' or st == 'dead' or st == 'cancelled' then
  -- Finished (or cancelled), not yet settled: its worker (or canceller) may have died before the result row.
  return {'finished', st .. '|' .. (f[5] or 'null')}
end
-- A task waiting on a limit, or for its due time, has no message out: a copy is an old one.
if st == 'limited' or st == 'scheduled' or tonumber(ARGV[2]) < tonumber(f[2]) then return {'stale'} end
local now = tonumber(ARGV[4])
if st == 'running' and f[3] ~= ARGV[3] and f[3] ~= ARGV[7] then
  local lease = tonumber(redis.call('ZSCORE', KEYS[2], KEYS[1]) or '0')
  if lease > now then return {'busy', f[3]} end
end
if f[4] ~= '' and redis.call('LINDEX', KEYS[4], 0) ~= ARGV[1] then
  return {'nothead'}
end
local dlv = tonumber(f[7] or '0') + 1
if dlv > tonumber(ARGV[6]) then
  redis.call('HSET', KEYS[1], 'dlv', dlv)
  return {'poison', dlv}
end
redis.call('HSET', KEYS[1], 'st', 'running', 'own', ARGV[3], 'dlv', dlv)
if KEYS[6] then waiting_remove(KEYS[6], KEYS[1], ARGV[10], f[6]) end
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[5]), KEYS[1])
if KEYS[8] then
  -- The claim names its owner's process: if that process dies, the sweep of
  -- dead processes (reclaim.lua) finds this record without waiting for its lease.
  redis.call('SADD', KEYS[8], KEYS[1])
  -- A process that has not beaten yet registers with its claim (0: it has, its beat keeps it).
  if tonumber(ARGV[9]) > 0 then redis.call('ZADD', KEYS[7], 'NX', now + tonumber(ARGV[9]), ARGV[8]) end
end
-- Its counts (started, queue latency) are the caller's, kept in process (lanes.counters).
return {'run', dlv, redis.call('GET', KEYS[3]) or '0'}

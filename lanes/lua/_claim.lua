-- _claim.lua: claim one task's attempt (claim_record), included by start.lua (one task a call),
-- claim_group.lua (a worker's group of plain tasks a call) and pop_more.lua (plain tasks claimed
-- as they are popped).
--
-- ``c`` holds the call's constants: leases, config (the config version key), deadlines
-- (the waiting tasks' deadlines set), procs (live processes), held (the claiming
-- process's held set), now, lease_ms, max_dlv, process, liveness_ms, lane_prefix, and what the
-- call's claims gather: leased, claimed, seen, by_lane and lanes (claim_flush writes them).
-- Returns the reply as values: 'run', deliveries | 'finished', 'done|<result>' or
-- 'dead|null' or 'cancelled|<detail JSON>' | 'gone' | 'stale' | 'busy', owner
-- | 'nothead' | 'poison', deliveries.

-- The record's fields a claim reads, in claim_fields' order (pop_more.lua reads them with the message).
local CLAIM_READ = {'st', 'att', 'own', 'chat', 'res', 'lane', 'dlv'}
-- Each one's place in it (claim_fields, and pop_more.lua's read of them).
local CLAIM_ST, CLAIM_ATT, CLAIM_OWN, CLAIM_CHAT, CLAIM_RES, CLAIM_LANE, CLAIM_DLV = 1, 2, 3, 4, 5, 6, 7

-- claim_record's decision and writes on the fields it read (``f``: CLAIM_READ's values, in order).
local function claim_fields(c, record, f, task_id, attempt, owner, dead_owner, chat_queue, tombstone)
  local st = f[CLAIM_ST]
  if not st then
    local tomb = redis.call('GET', tombstone)
    if tomb then return 'finished', tomb end
    return 'gone'
  end
  if st == 'done' or st == 'dead' or st == 'cancelled' then
    -- Finished (or cancelled), not yet settled: its worker (or canceller) may have died before the result row.
    return 'finished', st .. '|' .. (f[CLAIM_RES] or 'null')
  end
  -- A task waiting on a limit, or for its due time, has no message out: a copy is an old one.
  if st == 'limited' or st == 'scheduled' or tonumber(attempt) < tonumber(f[CLAIM_ATT]) then return 'stale' end
  -- A copy of a task this call already claimed (two deliveries in one group) is busy.
  if c.seen[record] then return 'busy', c.seen[record] end
  if st == 'running' and f[CLAIM_OWN] ~= owner and f[CLAIM_OWN] ~= dead_owner then
    local lease = tonumber(redis.call('ZSCORE', c.leases, record) or '0')
    if lease > c.now then return 'busy', f[CLAIM_OWN] end
  end
  if f[CLAIM_CHAT] ~= '' and redis.call('LINDEX', chat_queue, 0) ~= task_id then
    return 'nothead'
  end
  local dlv = tonumber(f[CLAIM_DLV] or '0') + 1
  if dlv > c.max_dlv then
    redis.call('HSET', record, 'dlv', dlv)
    return 'poison', dlv
  end
  redis.call('HSET', record, 'st', 'running', 'own', owner, 'dlv', dlv)
  -- It leaves the deadlines set and its lane's waiting count with the call's other claims (claim_flush).
  local lane = f[CLAIM_LANE] or ''
  if not c.by_lane[lane] then
    c.by_lane[lane] = {}
    c.lanes[#c.lanes + 1] = lane
  end
  table.insert(c.by_lane[lane], record)
  c.leased[#c.leased + 1] = c.now + c.lease_ms
  c.leased[#c.leased + 1] = record
  c.claimed[#c.claimed + 1] = record
  c.seen[record] = owner
  return 'run', dlv
end

local function claim_record(c, record, task_id, attempt, owner, dead_owner, chat_queue, tombstone)
  return claim_fields(c, record, redis.call('HMGET', record, unpack(CLAIM_READ)), task_id, attempt, owner,
    dead_owner, chat_queue, tombstone)
end

-- The writes every claim of a call shares, once: out of the deadlines set and each lane's waiting
-- count (one ZREM and one DECRBY a lane, instead of two commands a claim), the leases, the claiming process's held set
-- (reclaim.lua finds its records there once the process is dead), and its liveness entry if it
-- has not beaten yet (liveness_ms 0: it has, its beat keeps it).
local function claim_flush(c)
  if #c.claimed == 0 then return end
  for _, lane in ipairs(c.lanes) do
    waiting_remove_all(c.deadlines, c.by_lane[lane], c.lane_prefix, lane ~= '' and lane or nil)
  end
  redis.call('ZADD', c.leases, unpack(c.leased))
  redis.call('SADD', c.held, unpack(c.claimed))
  if c.liveness_ms > 0 then redis.call('ZADD', c.procs, 'NX', c.now + c.liveness_ms, c.process) end
end

-- start.lua: claim a task's execution before its handler runs (claim_record, _claim.lua).
--
-- KEYS: record, leases, config_version, chat_queue (or the record), tombstone (written by
--   finish.lua), deadlines (a claimed task leaves it: its worker keeps the deadline),
--   procs (live processes: host:pid -> liveness expiry ms), held (the claiming process's
--   held set: reclaim.lua reads it once the process is dead)
-- ARGV: task_id, attempt (carried by the message), owner (host:pid:thread), now_ms, lease_ms,
--   max_deliveries, dead_owner (an owner known dead, or ''), process (host:pid),
--   liveness_ms (a process claiming before its first beat registers with it; 0 once it has
--   beaten), lane_prefix (the lane's waiting count drops with the claim, _lib.lua)
-- Returns {'run', deliveries, config_version} | {'finished', 'done|<result>' or
--   'dead|null' or 'cancelled|<detail JSON>' (cancel.lua: a cancelled copy is dropped, never run)}
--   | {'gone'} (never accepted, or finished long ago) | {'stale'} | {'busy', owner} | {'nothead'}
--   | {'poison', deliveries}
local record, leases, config_version, chat_queue, tombstone, deadlines, procs, held = unpack(KEYS, 1, 8)
local task_id, attempt, owner, now_ms, lease_ms, max_deliveries, dead_owner, process, liveness_ms, lane_prefix =
  unpack(ARGV, 1, 10)

--! include _claim.lua

local c = {
  leases = leases, deadlines = deadlines, procs = procs, held = held, now = tonumber(now_ms),
  lease_ms = tonumber(lease_ms), max_dlv = tonumber(max_deliveries), process = process,
  liveness_ms = tonumber(liveness_ms), lane_prefix = lane_prefix,
  leased = {}, claimed = {}, seen = {}, by_lane = {}, lanes = {},
}
local status, detail = claim_record(c, record, task_id, attempt, owner, dead_owner, chat_queue, tombstone)
claim_flush(c)
-- Its counts (started, queue latency) are the caller's, kept in process (lanes.counters).
if status == 'run' then return {'run', detail, redis.call('GET', config_version) or '0'} end
return {status, detail}

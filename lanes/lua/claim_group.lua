-- claim_group.lua: claim a worker's group of delivered plain tasks, in one call (tasks/grouping.py);
-- each item exactly as start.lua claims one task (claim_record, _claim.lua).
--
-- KEYS: leases, config_version, deadlines, procs, held (as start.lua's)
-- ARGV: now_ms, lease_ms, max_deliveries, process, liveness_ms, lane_prefix, then FIELDS per item:
--   task_id, record, attempt, owner, chat_queue ('' when it has no chat), tombstone
-- Returns {config_version, status, detail, status, detail, ...}: one pair per item, in order
--   (claim_record's reply; detail '' where it has none).
local leases, config_version, deadlines, procs, held = unpack(KEYS, 1, 5)
local now_ms, lease_ms, max_deliveries, process, liveness_ms, lane_prefix = unpack(ARGV, 1, 6)
local FIRST_ITEM, FIELDS = 7, 6

--! include _claim.lua

local c = {
  leases = leases, deadlines = deadlines, procs = procs, held = held, now = tonumber(now_ms),
  lease_ms = tonumber(lease_ms), max_dlv = tonumber(max_deliveries), process = process,
  liveness_ms = tonumber(liveness_ms), lane_prefix = lane_prefix,
  leased = {}, claimed = {}, seen = {}, by_lane = {}, lanes = {},
}
local out = {redis.call('GET', config_version) or '0'}
for i = FIRST_ITEM, #ARGV, FIELDS do
  local task_id, record, attempt, owner, chat_queue, tombstone = unpack(ARGV, i, i + FIELDS - 1)
  local status, detail = claim_record(c, record, task_id, attempt, owner, '', chat_queue, tombstone)
  out[#out + 1] = status
  out[#out + 1] = detail and tostring(detail) or ''
end
claim_flush(c)
return out

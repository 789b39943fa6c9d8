-- claim_group.lua: a worker's group call (tasks/grouping.py), in one round trip: first the
-- succeeded attempts gathered since its last call reach 'done', each exactly as finish.lua
-- finishes one task (finish_record, _lib.lua); then the delivered plain tasks are claimed, each
-- exactly as start.lua claims one (claim_record, _claim.lua). Either part may be empty. Finishing
-- first hands each chat over before any claim of this call reads a chat's head.
--
-- KEYS: leases, config_version, deadlines, procs, held (as start.lua's), then active chats index,
--   metrics totals, metrics minute (as finish_batch.lua's)
-- ARGV: now_ms, lease_ms, max_deliveries, process, liveness_ms, lane_prefix, n_claims,
--   tombstone_ttl_s, queued_lease_ms, settle_lease_ms, chat_waiting_prefix, limit_prefix,
--   chat_prefix, tombstone_prefix, then CLAIM_FIELDS per claimed item:
--   task_id, record, attempt, owner, chat_queue ('' when it has no chat), tombstone;
--   then FINISH_ITEM_FIELDS (_lib.lua) per finished item: task_id, record, chat id or '', result JSON, owner,
--   tombstone ('1': write it; '': its type keeps a result row)
-- Returns {config_version ('' without claims), n_claims pairs (status, detail: claim_record's reply; detail '' where
--   it has none), then one reply per finished item: 'ok' | 'already' | 'gone' | 'taken'}.
local leases, config_version, deadlines, procs, held, chats, metrics_total, metrics_minute = unpack(KEYS, 1, 8)
local now_ms, lease_ms, max_deliveries, process, liveness_ms, lane_prefix, n_claims = unpack(ARGV, 1, 7)
local tomb_ttl_s, queued_lease_ms, settle_lease_ms, chat_waiting_prefix, limit_prefix, chat_prefix,
  tombstone_prefix = unpack(ARGV, 8, 14)
local FIRST_ITEM, CLAIM_FIELDS = 15, 6

--! include _claim.lua

local now = tonumber(now_ms)
local first_finish = FIRST_ITEM + tonumber(n_claims) * CLAIM_FIELDS
local finished = {}
if first_finish <= #ARGV then
  finished = finish_done_items({
    leases = leases, deadlines = deadlines, chats = chats, metrics_total = metrics_total,
    metrics_minute = metrics_minute, now = now, tomb_ttl_s = tomb_ttl_s, queued_lease_ms = queued_lease_ms,
    settle_lease_ms = settle_lease_ms, chat_waiting_prefix = chat_waiting_prefix, limit_prefix = limit_prefix,
    lane_prefix = lane_prefix, chat_prefix = chat_prefix, tombstone_prefix = tombstone_prefix,
  }, first_finish)
end

local c = {
  leases = leases, deadlines = deadlines, procs = procs, held = held, now = now,
  lease_ms = tonumber(lease_ms), max_dlv = tonumber(max_deliveries), process = process,
  liveness_ms = tonumber(liveness_ms), lane_prefix = lane_prefix,
  leased = {}, claimed = {}, seen = {}, by_lane = {}, lanes = {},
}
local out = {tonumber(n_claims) > 0 and (redis.call('GET', config_version) or '0') or ''}
for i = FIRST_ITEM, first_finish - 1, CLAIM_FIELDS do
  local task_id, record, attempt, owner, chat_queue, tombstone = unpack(ARGV, i, i + CLAIM_FIELDS - 1)
  local status, detail = claim_record(c, record, task_id, attempt, owner, '', chat_queue, tombstone)
  out[#out + 1] = status
  out[#out + 1] = detail and tostring(detail) or ''
end
claim_flush(c)
for _, reply in ipairs(finished) do out[#out + 1] = reply end
return out

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
--   then FINISH_FIELDS per finished item: task_id, record, chat id or '', result JSON, owner
-- Returns {config_version ('' without claims), n_claims pairs (status, detail: claim_record's reply; detail '' where
--   it has none), then one reply per finished item: 'ok' | 'already' | 'gone' | 'taken'}.
local leases, config_version, deadlines, procs, held, chats, metrics_total, metrics_minute = unpack(KEYS, 1, 8)
local now_ms, lease_ms, max_deliveries, process, liveness_ms, lane_prefix, n_claims = unpack(ARGV, 1, 7)
local tomb_ttl_s, queued_lease_ms, settle_lease_ms, chat_waiting_prefix, limit_prefix, chat_prefix,
  tombstone_prefix = unpack(ARGV, 8, 14)
local FIRST_ITEM, CLAIM_FIELDS, FINISH_FIELDS = 15, 6, 5

--! include _claim.lua

local now = tonumber(now_ms)
local first_finish = FIRST_ITEM + tonumber(n_claims) * CLAIM_FIELDS
local finished = {}
if first_finish <= #ARGV then
  lim_setup(limit_prefix, lane_prefix, metrics_total, metrics_minute, now, leases, now + tonumber(queued_lease_ms))
  local f = {
    leases = leases, deadlines = deadlines, lane_prefix = lane_prefix, chats = chats,
    tomb_ttl_s = tonumber(tomb_ttl_s), settle_until = now + tonumber(settle_lease_ms),
    handover_until = now + tonumber(queued_lease_ms), chat_waiting_prefix = chat_waiting_prefix,
  }
  for i = first_finish, #ARGV, FINISH_FIELDS do
    local task_id, record, chat, result, owner = unpack(ARGV, i, i + FINISH_FIELDS - 1)
    local chat_base = chat_prefix .. '{' .. chat .. '}'
    finished[#finished + 1] = finish_record(f, record, task_id, 'done', result, owner, tombstone_prefix .. task_id,
      chat, chat_base .. CHAT_QUEUE_SUFFIX, chat_base .. CHAT_RECORDS_SUFFIX)
  end
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

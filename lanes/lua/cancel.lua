-- cancel.lua: cancel tasks that are no longer wanted, each in one atomic step.
--
-- KEYS: leases, deadlines (of waiting tasks), chats (the active chats index), metrics_total,
--   metrics_minute, chat_queue (mode 'chat'; else leases again, unused), then the task
--   records to cancel (mode 'records', from RECORDS on; none in mode 'chat')
-- ARGV: now_ms, detail_json (the cancel's detail, kept in the record and its tombstone:
--   the REVOKED row's reason, also when a worker stores it later), tombstone_ttl_s,
--   tombstone_prefix, settle_lease_ms, queued_lease_ms, chat_prefix ('dispatch:chat:'),
--   chat_waiting_prefix, delayed_prefix, limit_prefix, lane_prefix (its limited count,
--   and its waiting count kept with the deadlines set: _lib.lua), mode ('records' |
--   'chat'), chat_id (mode 'chat'), detail_text (the detail as plain text: a running
--   task's flag), only_lane ('' for any), waiting_only ('1': leave running tasks alone,
--   a lane purge cancels what waits only), then the task ids of the records, in the
--   same order (mode 'records', from IDS on)
-- Returns a flat list {task_id, outcome, detail, lane, type, chat, ...}, six per target
--   (lane, type and chat are '' unless the outcome is 'cancelled'):
--   'cancelled' (it waited; removed; the record is kept as 'cancelled' under a
--   settle lease until the caller stored the REVOKED row and settled it with
--   forget.lua: if the caller dies first, the sweep republishes it and a worker
--   stores the row from the record, as for a finished task), 'told' (running:
--   flag 'cx' set, the worker reads it as ctx.cancelled), 'already' (cancelled
--   before), 'done' / 'dead' (finished; detail: the stored result), 'unknown'
--   (no record, no tombstone), 'skipped' (running, in a purge), 'elsewhere' (another lane, in a purge).
--
-- A waiting task (queued, scheduled, parked for a retry, limited, or behind its
-- chat's head) leaves everything that counts it: its lane list copy (searched
-- from the consuming end; a copy a worker already popped meets start.lua, which
-- answers 'finished' for a cancelled record, so it never runs), the delayed set,
-- its limit's waiting set and the lane's limited count, the slots it held, the
-- chat-waiting count, the deadlines set and the lane's waiting count; a chat
-- head hands its chat to the next message here (as finish.lua does); a message
-- behind the head leaves the chat queue. Mode 'chat' walks the chat queue from its tail, so a cancelled head
-- hands over only once, to what is left.

local leases, deadlines, chats, metrics_total, metrics_minute, chat_queue = KEYS[1], KEYS[2], KEYS[3], KEYS[4],
  KEYS[5], KEYS[6]
local now, detail_json, tombstone_ttl_s, tombstone_prefix, settle_lease_ms, queued_lease_ms = tonumber(ARGV[1]),
  ARGV[2], tonumber(ARGV[3]), ARGV[4], tonumber(ARGV[5]), tonumber(ARGV[6])
local chat_prefix, chat_waiting_prefix, delayed_prefix, limit_prefix, lane_prefix = ARGV[7], ARGV[8], ARGV[9],
  ARGV[10], ARGV[11]
local mode, chat_id, detail_text, only_lane, waiting_only = ARGV[12], ARGV[13], ARGV[14], ARGV[15], ARGV[16] == '1'
local RECORDS, IDS = 7, 17
local targets = #KEYS - RECORDS + 1
-- Target ``n`` (1-based) of mode 'records': its record and task id.
local function target(n) return KEYS[RECORDS + n - 1], ARGV[IDS + n - 1] end

local lease_until = now + queued_lease_ms
lim_setup(limit_prefix, lane_prefix, metrics_total, metrics_minute, now, leases, lease_until)
local out = {}

local function answer(task_id, outcome, detail, lane, ttype, chat)
  out[#out + 1] = task_id
  out[#out + 1] = outcome
  out[#out + 1] = detail or ''
  out[#out + 1] = lane or ''
  out[#out + 1] = ttype or ''
  out[#out + 1] = chat or ''
end

--! include _cancel.lua

local p = {now = now, detail_json = detail_json, detail_text = detail_text, tombstone_prefix = tombstone_prefix,
  tombstone_ttl_s = tombstone_ttl_s, settle_lease_ms = settle_lease_ms, lease_until = lease_until,
  chat_prefix = chat_prefix, chat_waiting_prefix = chat_waiting_prefix, delayed_prefix = delayed_prefix,
  lane_prefix = lane_prefix, leases = leases, deadlines = deadlines, chats = chats, metrics_total = metrics_total,
  metrics_minute = metrics_minute, only_lane = only_lane, waiting_only = waiting_only}
local function cancel_one(record, task_id) answer(task_id, cancel_record(p, record, task_id)) end

if mode == 'chat' then
  local records = chat_tag(chat_prefix, chat_id) .. CHAT_RECORDS_SUFFIX
  local ids = redis.call('LRANGE', chat_queue, 0, -1)
  for i = #ids, 1, -1 do cancel_one(records .. ids[i], ids[i]) end
else
  for n = 1, targets do cancel_one(target(n)) end
end
return out

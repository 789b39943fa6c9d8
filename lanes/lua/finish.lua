-- finish.lua: a task reached a terminal state; hand its chat to the next message.
--
-- KEYS[1] task record   KEYS[2] leases   KEYS[3] chat queue (or the record)
-- KEYS[4] active chats index   KEYS[5] metrics totals   KEYS[6] metrics minute
-- KEYS[7] the task's tombstone (outcome and result, for a late redelivery)
-- KEYS[8] deadlines of waiting tasks (a finished task leaves it)
-- ARGV: 1 task id, 2 outcome ('done'|'dead'|'cancelled': a running task told by cancel.lua that stopped), 3 result JSON, 4 now ms,
--   5 seconds to keep the tombstone,
--   6 queued lease ms, 7 chat id or '', 8 chat record prefix, 9 chat-waiting key prefix,
--   10 owner that claimed this attempt ('' when the task is dead-lettered without a
--   claim, e.g. poison), 11 settle lease ms, 12 limits key prefix, 13 lane key prefix
--   (a task with limits gives its slots back here, and each freed slot goes to the
--   next waiting task in this call)
-- Returns {'ok', next_task_id or ''} | {'already', state} | {'gone'}
--   | {'taken', owner}
--
-- A worker re-sends this call when Redis did not answer (it may have run): a
-- second run finds the record finished or gone and changes nothing. 'taken'
-- means another worker claimed the task since: that attempt will finish it.
-- What finishing does, step by step: finish_record in _lib.lua (shared with
-- finish_batch.lua). Its counts (succeeded, dead or cancelled, completed per
-- lane, execution latency, the lane's handler seconds) are the caller's, kept in
-- process (lanes.counters): only an 'ok' reply counts them.

local record, leases, chat_queue, chats, metrics_total, metrics_minute, tombstone, deadlines = unpack(KEYS, 1, 8)
local task_id, outcome, result, now_ms, tomb_ttl_s, queued_lease_ms, chat_id, chat_records, chat_waiting_prefix,
  owner, settle_lease_ms, limit_prefix, lane_prefix = unpack(ARGV, 1, 13)

local now = tonumber(now_ms)
lim_setup(limit_prefix, lane_prefix, metrics_total, metrics_minute, now, leases, now + tonumber(queued_lease_ms))
local c = {
  leases = leases, deadlines = deadlines, lane_prefix = lane_prefix, chats = chats,
  tomb_ttl_s = tonumber(tomb_ttl_s), settle_until = now + tonumber(settle_lease_ms),
  handover_until = now + tonumber(queued_lease_ms), chat_waiting_prefix = chat_waiting_prefix,
}
local reply, detail = finish_record(c, record, task_id, outcome, result, owner, tombstone, chat_id, chat_queue,
  chat_records)
if reply == 'gone' then return {'gone'} end
return {reply, detail}

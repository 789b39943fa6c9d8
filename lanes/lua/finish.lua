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

local now = tonumber(ARGV[4])
lim_setup(ARGV[12], ARGV[13], KEYS[5], KEYS[6], now, KEYS[2], now + tonumber(ARGV[6]))
local c = {
  leases = KEYS[2], deadlines = KEYS[8], lane_prefix = ARGV[13], chats = KEYS[4],
  tomb_ttl_s = tonumber(ARGV[5]), settle_until = now + tonumber(ARGV[11]),
  handover_until = now + tonumber(ARGV[6]), chat_waiting_prefix = ARGV[9],
}
local reply, detail = finish_record(c, KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[10], KEYS[7], ARGV[7], KEYS[3], ARGV[8])
if reply == 'gone' then return {'gone'} end
return {reply, detail}

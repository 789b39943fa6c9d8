-- finish_batch.lua: the succeeded items of one batch reached 'done', in one call;
-- each item exactly as finish.lua finishes one task (docs/batching.md).
--
-- KEYS[1] leases   KEYS[2] active chats index   KEYS[3] metrics totals
-- KEYS[4] metrics minute   KEYS[5] deadlines of waiting tasks
-- ARGV: 1 now ms, 2 seconds to keep a tombstone, 3 queued lease ms,
--   4 settle lease ms, 5 chat-waiting key prefix, 6 limits key prefix, 7 lane
--   key prefix, 8 chat key prefix ('dispatch:chat:'), 9 tombstone key prefix,
--   10.. five per item: task id, record, chat id or '', result JSON, owner that
--   claimed it
-- Returns one reply per item, in order: 'ok' | 'already' | 'gone' | 'taken'
--   (what finish.lua answers; an item answered 'taken' stores no result row).
-- The batch's counts (succeeded, completed, latencies, handler seconds) are the
-- wrapper's, kept in process (lanes.counters), for the 'ok' items.
--
-- Each item goes through finish_record (_lib.lua), the steps finish.lua takes
-- for one task. Like finish.lua it is safe to run twice: a second run finds
-- each record already done and changes nothing.

local leases, chats, metrics_total, metrics_minute, deadlines = unpack(KEYS, 1, 5)
local now_ms, tomb_ttl_s, queued_lease_ms, settle_lease_ms, chat_waiting_prefix, limit_prefix, lane_prefix, chat_prefix,
  tombstone_prefix = unpack(ARGV, 1, 9)
local FIRST_ITEM, FIELDS = 10, 5

local now = tonumber(now_ms)
local replies = {}
lim_setup(limit_prefix, lane_prefix, metrics_total, metrics_minute, now, leases, now + tonumber(queued_lease_ms))
local c = {
  leases = leases, deadlines = deadlines, lane_prefix = lane_prefix, chats = chats,
  tomb_ttl_s = tonumber(tomb_ttl_s), settle_until = now + tonumber(settle_lease_ms),
  handover_until = now + tonumber(queued_lease_ms), chat_waiting_prefix = chat_waiting_prefix,
}

for i = FIRST_ITEM, #ARGV, FIELDS do
  local task_id, record, chat, result, owner = unpack(ARGV, i, i + FIELDS - 1)
  local chat_base = chat_prefix .. '{' .. chat .. '}'
  replies[#replies + 1] = finish_record(c, record, task_id, 'done', result, owner, tombstone_prefix .. task_id, chat,
    chat_base .. CHAT_QUEUE_SUFFIX, chat_base .. CHAT_RECORDS_SUFFIX)
end
return replies

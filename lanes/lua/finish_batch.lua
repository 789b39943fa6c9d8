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

local now = tonumber(ARGV[1])
local replies = {}
lim_setup(ARGV[6], ARGV[7], KEYS[3], KEYS[4], now, KEYS[1], now + tonumber(ARGV[3]))
local c = {
  leases = KEYS[1], deadlines = KEYS[5], lane_prefix = ARGV[7], chats = KEYS[2],
  tomb_ttl_s = tonumber(ARGV[2]), settle_until = now + tonumber(ARGV[4]),
  handover_until = now + tonumber(ARGV[3]), chat_waiting_prefix = ARGV[5],
}

for i = 10, #ARGV, 5 do
  local task_id, record, chat, result, owner = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4]
  local chat_base = ARGV[8] .. '{' .. chat .. '}:'
  replies[#replies + 1] = finish_record(c, record, task_id, 'done', result, owner, ARGV[9] .. task_id, chat,
    chat_base .. 'q', chat_base .. 't:')
end
return replies

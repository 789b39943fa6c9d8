-- finish_batch.lua: the succeeded items of one batch reached 'done', in one call;
-- each item exactly as finish.lua finishes one task (docs/batching.md).
--
-- KEYS[1] leases   KEYS[2] active chats index   KEYS[3] metrics totals
-- KEYS[4] metrics minute   KEYS[5] deadlines of waiting tasks
-- ARGV: 1 now ms, 2 seconds to keep a tombstone, 3 queued lease ms,
--   4 settle lease ms, 5 chat-waiting key prefix, 6 limits key prefix, 7 lane
--   key prefix, 8 chat key prefix ('dispatch:chat:'), 9 tombstone key prefix,
--   10.. FINISH_ITEM_FIELDS (_lib.lua) per item: task id, record, chat id or '', result JSON, owner that
--   claimed it, tombstone ('1': write the task's tombstone; '': not, its type keeps a result row)
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
local FIRST_ITEM = 10

return finish_done_items({
  leases = leases, deadlines = deadlines, chats = chats, metrics_total = metrics_total,
  metrics_minute = metrics_minute, now = tonumber(now_ms), tomb_ttl_s = tomb_ttl_s, queued_lease_ms = queued_lease_ms,
  settle_lease_ms = settle_lease_ms, chat_waiting_prefix = chat_waiting_prefix, limit_prefix = limit_prefix,
  lane_prefix = lane_prefix, chat_prefix = chat_prefix, tombstone_prefix = tombstone_prefix,
}, FIRST_ITEM)

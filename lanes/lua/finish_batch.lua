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
-- wrapper's, kept in process since issue 16 (lanes.counters), for the 'ok' items.
--
-- Like finish.lua it is safe to run twice: a second run finds each record
-- already done and changes nothing.

local now = tonumber(ARGV[1])
local replies = {}
lim_setup(ARGV[6], ARGV[7], KEYS[3], KEYS[4], now, KEYS[1], now + tonumber(ARGV[3]))

for i = 10, #ARGV, 5 do
  local task_id, record, chat, result, owner = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4]
  local f = redis.call('HMGET', record, 'st', 'lane', 'own', 'lim')
  local st = f[1]
  if not st then
    replies[#replies + 1] = 'gone'
  elseif st == 'done' or st == 'dead' or st == 'cancelled' then
    replies[#replies + 1] = 'already'
  elseif st == 'running' and f[3] ~= owner then
    replies[#replies + 1] = 'taken'
  else
    redis.call('HSET', record, 'st', 'done', 'res', result, 'own', '')
    redis.call('SET', ARGV[9] .. task_id, 'done|' .. result, 'EX', tonumber(ARGV[2]))
    -- As in finish.lua: an item claimed by this owner keeps its claim's lease and
    -- left the deadlines set at its claim; only another one settles here.
    if not (st == 'running' and f[3] == owner) then
      redis.call('ZADD', KEYS[1], now + tonumber(ARGV[4]), record)
      waiting_remove(KEYS[5], record, ARGV[7], f[2])
    end
    if f[4] then lim_release(record, f[4]) end
    if chat ~= '' then
      local queue = ARGV[8] .. '{' .. chat .. '}:q'
      if redis.call('LINDEX', queue, 0) == task_id then
        hand_over(queue, chat, ARGV[8] .. '{' .. chat .. '}:t:', KEYS[2], KEYS[1], now + tonumber(ARGV[3]), ARGV[5])
      end
    end
    replies[#replies + 1] = 'ok'
  end
end

return replies

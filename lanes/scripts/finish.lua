-- finish.lua: a task reached a terminal state; hand its chat to the next message.
--
-- KEYS[1] task record   KEYS[2] leases   KEYS[3] chat queue (or the record)
-- KEYS[4] active chats index   KEYS[5] metrics totals   KEYS[6] metrics minute
-- ARGV: 1 task id, 2 outcome ('done'|'dead'), 3 result JSON, 4 now ms,
--   5 seconds to keep the finished record (dedupes late redeliveries),
--   6 queued lease ms, 7 chat id or '', 8 chat record prefix,
--   9 metric field suffix ('lane|type'), 10 outcome detail (dead reason or ''),
--   11 execution-latency bucket label or '', 12 chat-waiting key prefix,
--   13 execution latency in seconds
-- Returns {'ok', next_task_id or ''} | {'already', state} | {'gone'}
--
-- The hand-over (pop the head, publish the next) and a dispatch's append
-- (admit.lua) are each one script, so they never interleave: a chat queue is
-- deleted by Redis only when this pop empties it, and an append after that
-- simply creates it again with the new message as head.

local st = redis.call('HGET', KEYS[1], 'st')
if not st then return {'gone'} end
if st == 'done' or st == 'dead' then return {'already', st} end
local lane = redis.call('HGET', KEYS[1], 'lane')
redis.call('HSET', KEYS[1], 'st', ARGV[2], 'res', ARGV[3], 'own', '')
redis.call('HDEL', KEYS[1], 'msg')
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[5]))
redis.call('ZREM', KEYS[2], KEYS[1])

local field = ARGV[9]
if ARGV[2] == 'done' then
  count_to(KEYS[5], KEYS[6], 'succeeded|' .. field)
else
  count_to(KEYS[5], KEYS[6], 'dead|' .. field .. '|' .. ARGV[10])
end
count_to(KEYS[5], KEYS[6], 'completed|' .. lane)
observe(KEYS[5], KEYS[6], 'xlat', field, ARGV[11], ARGV[13])

local chat_id = ARGV[7]
local next_id = ''
if chat_id ~= '' and redis.call('LINDEX', KEYS[3], 0) == ARGV[1] then
  redis.call('LPOP', KEYS[3])
  if tonumber(redis.call('ZINCRBY', KEYS[4], -1, chat_id)) <= 0 then redis.call('ZREM', KEYS[4], chat_id) end
  next_id = redis.call('LINDEX', KEYS[3], 0) or ''
  if next_id ~= '' then
    local next_record = ARGV[8] .. next_id
    local next_lane = redis.call('HGET', next_record, 'lane')
    publish_record(next_record, KEYS[2], tonumber(ARGV[4]) + tonumber(ARGV[6]))
    if next_lane then
      local waiting = ARGV[12] .. next_lane
      if redis.call('DECR', waiting) <= 0 then redis.call('DEL', waiting) end
    end
  end
end
return {'ok', next_id}

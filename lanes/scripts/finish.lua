-- finish.lua: a task reached a terminal state; hand its chat to the next message.
--
-- KEYS[1] task record   KEYS[2] leases   KEYS[3] chat queue (or the record)
-- KEYS[4] active chats index   KEYS[5] metrics totals   KEYS[6] metrics minute
-- KEYS[7] the task's tombstone (outcome and result, for a late redelivery)
-- ARGV: 1 task id, 2 outcome ('done'|'dead'), 3 result JSON, 4 now ms,
--   5 seconds to keep the tombstone,
--   6 queued lease ms, 7 chat id or '', 8 chat record prefix,
--   9 metric field suffix ('lane|type'), 10 outcome detail (dead reason or ''),
--   11 execution-latency bucket label or '', 12 chat-waiting key prefix,
--   13 execution latency in seconds, 14 owner that claimed this attempt ('' when
--   the task is dead-lettered without a claim, e.g. poison)
-- Returns {'ok', next_task_id or ''} | {'already', state} | {'gone'}
--   | {'taken', owner}
--
-- A worker re-sends this call when Redis did not answer (it may have run): a
-- second run finds the record gone and changes nothing. 'taken' means another
-- worker claimed the task since (our lease ran out while Redis was away): that
-- attempt will finish it, so this one must not hand the chat over under it.
--
-- The hand-over (pop the head, publish the next) and a dispatch's append
-- (admit.lua) are each one script, so they never interleave: a chat queue is
-- deleted by Redis only when this pop empties it, and an append after that
-- simply creates it again with the new message as head.

local f = redis.call('HMGET', KEYS[1], 'st', 'lane', 'own')
local st = f[1]
if not st then return {'gone'} end
if st == 'done' or st == 'dead' then return {'already', st} end
if ARGV[14] ~= '' and st == 'running' and f[3] ~= ARGV[14] then return {'taken', f[3]} end
local lane = f[2]
-- The record goes away with the task, so a finished chat leaves no key behind.
-- A small tombstone outside the chat's keys remembers the outcome for a while:
-- a worker killed after this script but before Celery stored the result gets
-- its message redelivered, and that delivery stores the result from here.
redis.call('DEL', KEYS[1])
redis.call('SET', KEYS[7], ARGV[2] .. '|' .. ARGV[3], 'EX', tonumber(ARGV[5]))
redis.call('ZREM', KEYS[2], KEYS[1])

local field = ARGV[9]
if ARGV[2] == 'done' then
  count_to(KEYS[5], KEYS[6], 'succeeded|' .. field)
else
  count_to(KEYS[5], KEYS[6], 'dead|' .. field .. '|' .. ARGV[10])
end
count_to(KEYS[5], KEYS[6], 'completed|' .. lane)
observe(KEYS[5], KEYS[6], 'xlat', field, ARGV[11], ARGV[13])

local next_id = ''
if ARGV[7] ~= '' and redis.call('LINDEX', KEYS[3], 0) == ARGV[1] then
  next_id = hand_over(KEYS[3], ARGV[7], ARGV[8], KEYS[4], KEYS[2],
    tonumber(ARGV[4]) + tonumber(ARGV[6]), ARGV[12])
end
return {'ok', next_id}

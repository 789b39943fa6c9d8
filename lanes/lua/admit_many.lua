-- admit_many.lua: admission of a chunk of one task type's dispatches in one call
-- (dispatch_many), each item exactly as admit.lua admits one (admit_one, _admit.lua).
--
-- KEYS[1..26] and ARGV[1..21]: admit.lua's, for the chunk (its type, lane and
--   config version); the slots that differ per item are taken from the items:
-- KEYS[27..]  an item's task record (admit.lua's KEYS[2]), then, when it has an
--   idempotency key (a payload digest), that key and its old format (KEYS[4],
--   KEYS[22]), then, when it has a chat, its chat's queue (KEYS[5]): one key for
--   a plain item (the slots it leaves unused are its record, as admit.lua's are)
-- ARGV[22..]  eight per item: task id, message, kombu priority, chat id, payload
--   digest, deadline ms, limit instance bases, due ms (admit.lua's ARGV 3, 4, 5,
--   8, 10, 16, 17, 20)
-- Returns {'stale', version} when the config changed (no item was looked at),
--   else {inputs, reply 1, reply 2, ...}: one admit.lua reply per item, in order,
--   an 'ok' one shortened to its depth alone (a number: no limit holds the task,
--   its position is depth + 1 and the tasks ahead are its depth, as for any task
--   without a chat), {'ok', position, depth, ahead} (no limit holds it) or
--   {'ok', position, depth, ahead, waits_on, waiting_ahead, paused_ms};
--   ``inputs`` are the estimate inputs an 'ok' reply of admit.lua carries at 4, 5,
--   7, 8, 9, 10 (the lane's completions, handler seconds, paused flag, live
--   consumers), read once a call by the first item admitted ({} if none was):
--   the same for every item, so sent once (admit_many.py puts them back).
--
-- Why one call: admit.lua's EVALSHA, config GET and the lane's shared writes
-- (waiting count, deadlines, leases, lane list) were one each per item; here
-- they are one each per call (pend, _admit.lua), so a plain item costs Redis
-- its record's HSET and little else (docs/redis-budget.md).

--! include _admit.lua

local version = redis.call('GET', KEYS[1]) or '0'
if version ~= ARGV[1] then
  return {'stale', version}
end

local K, A = {}, {}
for i = 1, 26 do K[i] = KEYS[i] end
for i = 1, 21 do A[i] = ARGV[i] end
local pend = pend_new()
local replies = {{}}
local estimate = nil  -- an 'ok' reply's inputs, read once
local n = (#ARGV - 21) / 8
local k = 27
for item = 0, n - 1 do
  local a = 22 + item * 8
  local record, digest, chat = KEYS[k], ARGV[a + 4], ARGV[a + 3]
  k = k + 1
  K[2], K[4], K[5], K[22] = record, record, record, record
  if digest ~= '' then
    K[4], K[22] = KEYS[k], KEYS[k + 1]
    k = k + 2
  end
  if chat ~= '' then
    K[5] = KEYS[k]
    k = k + 1
  end
  A[3], A[4], A[5], A[8], A[10] = ARGV[a], ARGV[a + 1], ARGV[a + 2], chat, digest
  A[16], A[17], A[20] = ARGV[a + 5], ARGV[a + 6], ARGV[a + 7]
  A[21] = estimate and '0' or ARGV[21]
  local status, position, depth, done, prev, ahead, busy, prev_busy, paused, consumers, waits_on, waiting_ahead,
    paused_ms = admit_one(K, A, pend)
  if status == 'ok' then
    if A[21] ~= '0' then estimate = {done, prev, busy, prev_busy, paused, consumers} end
    if waits_on ~= '' then
      replies[item + 2] = {'ok', position, depth, ahead, waits_on, waiting_ahead, paused_ms}
    elseif position == depth + 1 and ahead == depth then
      replies[item + 2] = depth  -- the common reply, a number: admit_many.py reads it back
    else
      replies[item + 2] = {'ok', position, depth, ahead}
    end
  else
    replies[item + 2] = {status, position, depth}  -- ('rej', reason, depth), ('dup'|'conflict', task id)
  end
end
pend_flush(pend, ARGV[19] .. ARGV[13] .. ':waiting', KEYS[23], KEYS[3])
if estimate then replies[1] = estimate end
return replies

-- admit_many.lua: admission of a chunk of one task type's dispatches in one call
-- (dispatch_many), each item exactly as admit.lua admits one (admit_one, _admit.lua).
--
-- KEYS[1..26] and ARGV[1..21]: admit.lua's, for the chunk (its type, lane and
--   config version); the slots that differ per item are taken from the items:
-- KEYS[27..]  four per item: task record, idempotency key, chat queue, the
--   idempotency key's old format (admit.lua's KEYS 2, 4, 5, 22)
-- ARGV[22..]  eight per item: task id, message, kombu priority, chat id, payload
--   digest, deadline ms, limit instance bases, due ms (admit.lua's ARGV 3, 4, 5,
--   8, 10, 16, 17, 20)
-- Returns {'stale', version} when the config changed (no item was looked at),
--   else one admit.lua reply per item, in order. The estimate inputs (the lane's
--   completions, handler seconds, paused flag, live consumers) are read once a
--   call, by the first item admitted, and given to every 'ok' reply.
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
local replies = {}
local estimate = nil  -- an 'ok' reply's inputs, read once
local n = (#KEYS - 26) / 4
for item = 0, n - 1 do
  local k, a = 27 + item * 4, 22 + item * 8
  K[2], K[4], K[5], K[22] = KEYS[k], KEYS[k + 1], KEYS[k + 2], KEYS[k + 3]
  A[3], A[4], A[5], A[8], A[10] = ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4]
  A[16], A[17], A[20] = ARGV[a + 5], ARGV[a + 6], ARGV[a + 7]
  A[21] = estimate and '0' or ARGV[21]
  local reply = admit_one(K, A, pend)
  if reply[1] == 'ok' and A[21] ~= '0' then estimate = reply end
  replies[#replies + 1] = reply
end
pend_flush(pend, ARGV[19] .. ARGV[13] .. ':waiting', KEYS[23], KEYS[3])
if estimate then
  for _, reply in ipairs(replies) do
    if reply[1] == 'ok' then
      for _, i in ipairs({4, 5, 7, 8, 9, 10}) do reply[i] = estimate[i] end
    end
  end
end
return replies

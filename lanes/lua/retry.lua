-- retry.lua: park a failed attempt's successor in the lane's delayed set.
--
-- KEYS[1] task record   KEYS[2] leases   KEYS[3] lane delayed set
-- KEYS[4] metrics totals   KEYS[5] metrics minute
-- KEYS[6] deadlines of waiting tasks: the parked attempt waits again, under the task's deadline
-- ARGV: 1 next attempt, 2 its message, 3 due ms, 4 queued lease ms,
--   5 metric field suffix ('lane|type'), 6 owner that claimed this attempt,
--   7 now ms, 8 the provider's Retry-After in ms (0: none), 9 limits key prefix,
--   10 lane key prefix
-- Returns {'ok'} | {'already', state} | {'cancelled', detail} (cancel.lua told it: never
--   retried; the worker ends it as cancelled with finish.lua)
--
-- Safe to send again when Redis did not answer: a second run finds the task
-- parked ('already'). Nor does it park an attempt another worker took over.
--
-- A task with limits gives its slots back (the parked retry passes the gate
-- again when due). With a Retry-After, every ``global`` and ``key`` instance of
-- its limits is paused until then, in this same step: every task of that key
-- waits, not only this one (a chat-scoped instance is the chat's own business).
--
-- The message leaves worker memory: it waits in Redis, so a delay longer than
-- the broker's visibility timeout cannot make it run twice.

local f = redis.call('HMGET', KEYS[1], 'st', 'att', 'own', 'lim', 'cx', 'lane')
if f[1] ~= 'running' or tonumber(f[2]) ~= tonumber(ARGV[1]) - 1 or f[3] ~= ARGV[6] then
  return {'already', f[1] or ''}
end
if f[5] then return {'cancelled', f[5]} end
local due = tonumber(ARGV[3])
redis.call('HSET', KEYS[1], 'msg', ARGV[2], 'att', ARGV[1], 'st', 'retry', 'dlv', '0', 'own', '')
redis.call('ZADD', KEYS[3], due, KEYS[1])
redis.call('ZADD', KEYS[2], due + tonumber(ARGV[4]), KEYS[1])
local deadline = redis.call('HGET', KEYS[1], 'dl')
if KEYS[6] and deadline then waiting_add(KEYS[6], KEYS[1], tonumber(deadline), ARGV[10], f[6]) end
if f[4] then
  local now = tonumber(ARGV[7])
  lim_setup(ARGV[9], ARGV[10], KEYS[4], KEYS[5], now, KEYS[2], now + tonumber(ARGV[4]))
  local pause_ms = tonumber(ARGV[8])
  if pause_ms > 0 then
    for _, base in ipairs(lim_split(f[4])) do
      local d = lim_def((lim_parts(base)))
      if d and (d.scope == 'key' or d.scope == 'global') then
        local until_ms = now + pause_ms
        if until_ms > tonumber(redis.call('GET', base .. ':p') or '0') then
          redis.call('SET', base .. ':p', until_ms, 'PX', pause_ms)
        end
      end
    end
  end
  lim_release(KEYS[1], f[4])
end
count_to(KEYS[4], KEYS[5], 'retried|' .. ARGV[5] .. '|' .. (tonumber(ARGV[1]) - 1))
return {'ok'}

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

local record, leases, delayed, metrics_total, metrics_minute, deadlines = unpack(KEYS, 1, 6)
local next_attempt, message, due_ms, queued_lease_ms, metric_field, owner, now_ms, retry_after_ms, limit_prefix,
  lane_prefix = unpack(ARGV, 1, 10)

local f = redis.call('HMGET', record, 'st', 'att', 'own', 'lim', 'cx', 'lane')
if f[1] ~= 'running' or tonumber(f[2]) ~= tonumber(next_attempt) - 1 or f[3] ~= owner then
  return {'already', f[1] or ''}
end
if f[5] then return {'cancelled', f[5]} end
local due = tonumber(due_ms)
redis.call('HSET', record, 'msg', message, 'att', next_attempt, 'st', 'retry', 'dlv', '0', 'own', '')
redis.call('ZADD', delayed, due, record)
redis.call('ZADD', leases, due + tonumber(queued_lease_ms), record)
local deadline = redis.call('HGET', record, 'dl')
if deadlines and deadline then waiting_add(deadlines, record, tonumber(deadline), lane_prefix, f[6]) end
if f[4] then
  local now = tonumber(now_ms)
  lim_setup(limit_prefix, lane_prefix, metrics_total, metrics_minute, now, leases, now + tonumber(queued_lease_ms))
  local pause_ms = tonumber(retry_after_ms)
  if pause_ms > 0 then
    for _, base in ipairs(lim_split(f[4])) do
      local d = lim_def((lim_parts(base)))
      if d and (d.scope == 'key' or d.scope == 'global') then
        local until_ms = now + pause_ms
        if until_ms > tonumber(redis.call('GET', base .. LIMIT_PAUSED_SUFFIX) or '0') then
          redis.call('SET', base .. LIMIT_PAUSED_SUFFIX, until_ms, 'PX', pause_ms)
        end
      end
    end
  end
  lim_release(record, f[4])
end
count_to(metrics_total, metrics_minute, 'retried|' .. metric_field .. '|' .. (tonumber(next_attempt) - 1))
return {'ok'}

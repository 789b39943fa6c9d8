-- cancel.lua: cancel tasks that are no longer wanted, each in one atomic step.
--
-- KEYS[1] leases   KEYS[2] deadlines of waiting tasks   KEYS[3] active chats index
-- KEYS[4] metrics totals   KEYS[5] metrics minute
-- KEYS[6] the chat queue (mode 'chat'), else leases again (unused)
-- KEYS[7..] the task records to cancel (mode 'records'; none in mode 'chat')
-- ARGV: 1 now ms, 2 the cancel's detail as JSON (kept in the record and its
--   tombstone: the REVOKED row's reason, also when a worker stores it later),
--   3 seconds to keep the tombstone, 4 tombstone key prefix, 5 settle lease ms,
--   6 queued lease ms, 7 chat key prefix ('dispatch:chat:'), 8 chat-waiting key
--   prefix, 9 delayed-set key prefix, 10 limits key prefix, 11 lane key prefix (its
--   limited count, and its waiting count kept with the deadlines set: _lib.lua),
--   12 mode ('records' | 'chat'), 13 chat id (mode 'chat'), 14 the detail as
--   plain text (a running task's flag), 15 only this lane ('' for any),
--   16 '1' to leave running tasks alone (a lane purge cancels what waits only),
--   17.. the task ids of KEYS[7..], in the same order (mode 'records')
-- Returns a flat list {task_id, outcome, detail, lane, type, chat, ...}, six per target
--   (lane, type and chat are '' unless the outcome is 'cancelled'):
--   'cancelled' (it waited; removed; the record is kept as 'cancelled' under a
--   settle lease until the caller stored the REVOKED row and settled it with
--   forget.lua: if the caller dies first, the sweep republishes it and a worker
--   stores the row from the record, as for a finished task), 'told' (running:
--   flag 'cx' set, the worker reads it as ctx.cancelled), 'already' (cancelled
--   before), 'done' / 'dead' (finished; detail: the stored result), 'unknown'
--   (no record, no tombstone), 'skipped' (running, in a purge), 'elsewhere' (another lane, in a purge).
--
-- A waiting task (queued, scheduled, parked for a retry, limited, or behind its
-- chat's head) leaves everything that counts it: its lane list copy (searched
-- from the consuming end; a copy a worker already popped meets start.lua, which
-- answers 'finished' for a cancelled record, so it never runs), the delayed set,
-- its limit's waiting set and the lane's limited count, the slots it held, the
-- chat-waiting count, the deadlines set and the lane's waiting count; a chat
-- head hands its chat to the next message here (as finish.lua does); a message
-- behind the head leaves the chat queue. Mode 'chat' walks the chat queue from its tail, so a cancelled head
-- hands over only once, to what is left.

local now = tonumber(ARGV[1])
local detail_json, detail_text = ARGV[2], ARGV[14]
local only_lane, waiting_only = ARGV[15], ARGV[16] == '1'
local lease_until = now + tonumber(ARGV[6])
lim_setup(ARGV[10], ARGV[11], KEYS[4], KEYS[5], now, KEYS[1], lease_until)
local out = {}

local function answer(task_id, outcome, detail, lane, ttype, chat)
  out[#out + 1] = task_id
  out[#out + 1] = outcome
  out[#out + 1] = detail or ''
  out[#out + 1] = lane or ''
  out[#out + 1] = ttype or ''
  out[#out + 1] = chat or ''
end

local function cancel_one(record, task_id)
  local f = redis.call('HMGET', record, 'st', 'lane', 'type', 'chat', 'q', 'pub', 'msg', 'lim', 'lw', 'res')
  local st, lane, chat = f[1], f[2], f[4]
  if not st then
    local tomb = redis.call('GET', ARGV[4] .. task_id)
    if not tomb then return answer(task_id, 'unknown') end
    local outcome, rest = string.match(tomb, '^([^|]*)|(.*)$')
    if outcome == 'cancelled' then outcome = 'already' end
    return answer(task_id, outcome or 'done', rest)
  end
  if st == 'done' or st == 'dead' then return answer(task_id, st, f[10]) end
  if st == 'cancelled' then return answer(task_id, 'already', f[10]) end
  if only_lane ~= '' and lane ~= only_lane then return answer(task_id, 'elsewhere') end
  if st == 'running' then
    if waiting_only then return answer(task_id, 'skipped', 'running') end
    -- Told, not stopped: its handler reads ctx.cancelled; it is never retried (retry.lua).
    redis.call('HSETNX', record, 'cx', detail_text)
    return answer(task_id, 'told')
  end
  if st ~= 'queued' and st ~= 'retry' and st ~= 'scheduled' and st ~= 'limited' then
    return answer(task_id, 'skipped', 'state ' .. st)
  end
  if st == 'limited' then
    if f[9] and redis.call('ZREM', f[9] .. ':w', record) == 1 then lim_count(f[9], -1) end
    lim_lane_waiting(lane, -1)
  elseif st == 'queued' and f[6] and f[6] ~= '0' then
    -- Its copy in the lane list (kombu pops from the tail: search from there).
    local msg = f[7]
    local mark = string.find(msg, '\0', 1, true)
    redis.call('LREM', f[5], -1, string.sub(msg, 1, mark - 1) .. task_id .. '.' .. f[6] .. string.sub(msg, mark + 1))
  end
  -- Scheduled or parked for a retry: it leaves the lane's delayed set (whatever its state says).
  redis.call('ZREM', ARGV[9] .. lane, record)
  redis.call('HSET', record, 'st', 'cancelled', 'res', detail_json, 'own', '')
  redis.call('HDEL', record, 'lw', 'ls')
  if st == 'queued' and f[8] then lim_release(record, f[8]) end
  if chat and chat ~= '' then
    local base = ARGV[7] .. '{' .. chat .. '}:'
    local queue = base .. 'q'
    if redis.call('LINDEX', queue, 0) == task_id then
      hand_over(queue, chat, base .. 't:', KEYS[3], KEYS[1], lease_until, ARGV[8])
    elseif redis.call('LREM', queue, 1, task_id) > 0 then
      if tonumber(redis.call('ZINCRBY', KEYS[3], -1, chat)) <= 0 then redis.call('ZREM', KEYS[3], chat) end
      -- Behind its head (never published): counted as waiting behind its chat, whether
      -- queued or sent for later ('scheduled' waits in the chat queue until handed over).
      if (st == 'queued' or st == 'scheduled') and (f[6] or '0') == '0' then
        local waiting = ARGV[8] .. lane
        if tonumber(redis.call('DECR', waiting)) <= 0 then redis.call('DEL', waiting) end
      end
    end
  end
  redis.call('SET', ARGV[4] .. task_id, 'cancelled|' .. detail_json, 'EX', tonumber(ARGV[3]))
  -- It leaves the deadlines set, and its lane's waiting count with it (_lib.lua).
  waiting_remove(KEYS[2], record, ARGV[11], lane)
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[5]), record)
  count_to(KEYS[4], KEYS[5], 'cancelled|' .. lane .. '|' .. (f[3] or ''))
  return answer(task_id, 'cancelled', '', lane, f[3], chat)
end

if ARGV[12] == 'chat' then
  local base = ARGV[7] .. '{' .. ARGV[13] .. '}:'
  local ids = redis.call('LRANGE', KEYS[6], 0, -1)
  for i = #ids, 1, -1 do cancel_one(base .. 't:' .. ids[i], ids[i]) end
else
  for i = 7, #KEYS do cancel_one(KEYS[i], ARGV[10 + i]) end
end
return out

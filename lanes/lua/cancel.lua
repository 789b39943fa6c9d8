-- cancel.lua: cancel tasks that are no longer wanted, each in one atomic step.
--
-- KEYS: leases, deadlines (of waiting tasks), chats (the active chats index), metrics_total,
--   metrics_minute, chat_queue (mode 'chat'; else leases again, unused), then the task
--   records to cancel (mode 'records', from RECORDS on; none in mode 'chat')
-- ARGV: now_ms, detail_json (the cancel's detail, kept in the record and its tombstone:
--   the REVOKED row's reason, also when a worker stores it later), tombstone_ttl_s,
--   tombstone_prefix, settle_lease_ms, queued_lease_ms, chat_prefix ('dispatch:chat:'),
--   chat_waiting_prefix, delayed_prefix, limit_prefix, lane_prefix (its limited count,
--   and its waiting count kept with the deadlines set: _lib.lua), mode ('records' |
--   'chat'), chat_id (mode 'chat'), detail_text (the detail as plain text: a running
--   task's flag), only_lane ('' for any), waiting_only ('1': leave running tasks alone,
--   a lane purge cancels what waits only), then the task ids of the records, in the
--   same order (mode 'records', from IDS on)
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

local leases, deadlines, chats, metrics_total, metrics_minute, chat_queue = KEYS[1], KEYS[2], KEYS[3], KEYS[4],
  KEYS[5], KEYS[6]
local now, detail_json, tombstone_ttl_s, tombstone_prefix, settle_lease_ms, queued_lease_ms = tonumber(ARGV[1]),
  ARGV[2], tonumber(ARGV[3]), ARGV[4], tonumber(ARGV[5]), tonumber(ARGV[6])
local chat_prefix, chat_waiting_prefix, delayed_prefix, limit_prefix, lane_prefix = ARGV[7], ARGV[8], ARGV[9],
  ARGV[10], ARGV[11]
local mode, chat_id, detail_text, only_lane, waiting_only = ARGV[12], ARGV[13], ARGV[14], ARGV[15], ARGV[16] == '1'
local RECORDS, IDS = 7, 17
local targets = #KEYS - RECORDS + 1
-- Target ``n`` (1-based) of mode 'records': its record and task id.
local function target(n) return KEYS[RECORDS + n - 1], ARGV[IDS + n - 1] end

local lease_until = now + queued_lease_ms
lim_setup(limit_prefix, lane_prefix, metrics_total, metrics_minute, now, leases, lease_until)
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
    local tomb = redis.call('GET', tombstone_prefix .. task_id)
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
    if f[9] and redis.call('ZREM', f[9] .. LIMIT_WAITING_SUFFIX, record) == 1 then lim_count(f[9], -1) end
    lim_lane_waiting(lane, -1)
  elseif st == 'queued' and f[6] and f[6] ~= '0' then
    -- Its copy in the lane list (kombu pops from the tail: search from there).
    redis.call('LREM', f[5], -1, list_item(record, f[6]))
  end
  -- Scheduled or parked for a retry: it leaves the lane's delayed set (whatever its state says).
  redis.call('ZREM', delayed_prefix .. lane, record)
  redis.call('HSET', record, 'st', 'cancelled', 'res', detail_json, 'own', '')
  redis.call('HDEL', record, 'lw', 'ls')
  if st == 'queued' and f[8] then lim_release(record, f[8]) end
  if chat and chat ~= '' then
    local tagged = chat_prefix .. '{' .. chat .. '}'
    local queue = tagged .. CHAT_QUEUE_SUFFIX
    if redis.call('LINDEX', queue, 0) == task_id then
      hand_over(queue, chat, tagged .. CHAT_RECORDS_SUFFIX, chats, leases, lease_until, chat_waiting_prefix)
    elseif redis.call('LREM', queue, 1, task_id) > 0 then
      if tonumber(redis.call('ZINCRBY', chats, -1, chat)) <= 0 then redis.call('ZREM', chats, chat) end
      -- Behind its head (never published): counted as waiting behind its chat, whether
      -- queued or sent for later ('scheduled' waits in the chat queue until handed over).
      if (st == 'queued' or st == 'scheduled') and (f[6] or '0') == '0' then
        local waiting = chat_waiting_prefix .. lane
        if tonumber(redis.call('DECR', waiting)) <= 0 then redis.call('DEL', waiting) end
      end
    end
  end
  redis.call('SET', tombstone_prefix .. task_id, 'cancelled|' .. detail_json, 'EX', tombstone_ttl_s)
  -- It leaves the deadlines set, and its lane's waiting count with it (_lib.lua).
  waiting_remove(deadlines, record, lane_prefix, lane)
  redis.call('ZADD', leases, now + settle_lease_ms, record)
  count_to(metrics_total, metrics_minute, 'cancelled|' .. lane .. '|' .. (f[3] or ''))
  return answer(task_id, 'cancelled', '', lane, f[3], chat)
end

if mode == 'chat' then
  local records = chat_prefix .. '{' .. chat_id .. '}' .. CHAT_RECORDS_SUFFIX
  local ids = redis.call('LRANGE', chat_queue, 0, -1)
  for i = #ids, 1, -1 do cancel_one(records .. ids[i], ids[i]) end
else
  for n = 1, targets do cancel_one(target(n)) end
end
return out

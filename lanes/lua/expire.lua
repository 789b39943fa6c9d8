-- expire.lua: waiting tasks whose deadline passed become `expired` dead letters (a batch).
--
-- KEYS: deadlines (zset: record -> deadline ms), pending (expired, rows not confirmed: zset),
--   leases, chats (the active chats index), metrics_total, metrics_minute
-- ARGV: now_ms, batch (most to expire), result_json (of the dead letter, kept in the
--   record and its tombstone), tombstone_ttl_s, queued_lease_ms, chat_prefix
--   ('dispatch:chat:'), chat_waiting_prefix, delayed_prefix, tombstone_prefix,
--   retry_rows_ms (before a pending row is handed out again), search_depth (how deep to
--   search a lane list for the expired copy), limit_prefix, lane_prefix
-- Returns a flat list {record, msg, ...}: the records expired now, then those
-- whose rows a caller took but did not confirm (retry_rows_ms ago or more).
--
-- Cost: one ZRANGEBYSCORE on the deadlines set and, per expired task, O(1)
-- steps plus a bounded search of its lane list; never a scan of the backlog.
--
-- A task waiting on a limit leaves its waiting set (the lane's limited count
-- drops); a published task with limits gives its slots back (lim_release).
--
-- Only a task that is still waiting (queued, scheduled, parked for a retry, or limited) expires
-- here: a claimed one is its worker's to finish (start.lua took it out of the
-- set). For each: it leaves its lane (its copy is removed from the lane list if
-- found near the consuming end, else a worker that pops it later is answered
-- 'finished' by start.lua and runs nothing), its chat moves on (a head hands
-- over as in finish.lua, a message behind the head leaves the chat queue), the
-- lane's counts drop, and the record is finished 'dead' with a tombstone.
--
-- Order, so nothing is lost if the caller dies between Redis and the database:
-- 1. this script (atomic) finishes the record and adds it to the pending set,
--    scored "hand out again at now + retry_rows_ms"; the record keeps its message;
-- 2. the caller writes the DeadLetter row and the FAILURE result row (both
--    idempotent: get_or_create, upsert);
-- 3. the caller settles the records (forget.lua with the pending set as its index),
--    which deletes them and their pending entries.
-- A caller that dies after 1 leaves the entry in the pending set: the next run
-- (any process) gets it back here and writes the rows again.

local deadlines, pending_set, leases, chats, metrics_total, metrics_minute = KEYS[1], KEYS[2], KEYS[3], KEYS[4],
  KEYS[5], KEYS[6]
local now, batch, result_json, tombstone_ttl_s, queued_lease_ms = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3],
  tonumber(ARGV[4]), tonumber(ARGV[5])
local chat_prefix, chat_waiting_prefix, delayed_prefix, tombstone_prefix = ARGV[6], ARGV[7], ARGV[8], ARGV[9]
local retry_rows_ms, window, limit_prefix, lane_prefix = tonumber(ARGV[10]), tonumber(ARGV[11]), ARGV[12], ARGV[13]

local out = {}
local retry_at = now + retry_rows_ms
lim_setup(limit_prefix, lane_prefix, metrics_total, metrics_minute, now, leases, now + queued_lease_ms)

local function remove_copy(record, queue, pub)
  local copy = list_item(record, pub)
  if redis.call('LPOS', queue, copy, 'RANK', -1, 'MAXLEN', window) then
    redis.call('LREM', queue, -1, copy)
  end
end

local due = redis.call('ZRANGEBYSCORE', deadlines, '-inf', now, 'LIMIT', 0, batch)
for _, record in ipairs(due) do
  local f = redis.call('HMGET', record, 'st', 'lane', 'type', 'chat', 'q', 'pub', 'msg', 'lim', 'lw')
  waiting_remove(deadlines, record, lane_prefix, f[2])
  local st, lane, chat = f[1], f[2], f[4]
  if st == 'queued' or st == 'retry' or st == 'limited' or st == 'scheduled' then
    local task_id = string.match(record, '([^:]+)$')
    if st == 'retry' or st == 'scheduled' then
      -- (A scheduled task behind its chat's head is not in the delayed set: ZREM does nothing.)
      redis.call('ZREM', delayed_prefix .. lane, record)
    elseif st == 'limited' then
      if f[9] and redis.call('ZREM', f[9] .. LIMIT_WAITING_SUFFIX, record) == 1 then lim_count(f[9], -1) end
      lim_lane_waiting(lane, -1)
    elseif f[6] and f[6] ~= '0' then
      remove_copy(record, f[5], f[6])
    end
    if st == 'queued' and f[8] then lim_release(record, f[8]) end
    if chat and chat ~= '' then
      local tagged = chat_tag(chat_prefix, chat)
      local queue = tagged .. CHAT_QUEUE_SUFFIX
      if redis.call('LINDEX', queue, 0) == task_id then
        hand_over(queue, chat, tagged .. CHAT_RECORDS_SUFFIX, chats, leases, now + queued_lease_ms, chat_waiting_prefix)
      elseif redis.call('LREM', queue, 1, task_id) > 0 then
        if tonumber(redis.call('ZINCRBY', chats, -1, chat)) <= 0 then redis.call('ZREM', chats, chat) end
        if (st == 'queued' and (f[6] or '0') == '0') or st == 'scheduled' then
          local waiting = chat_waiting_prefix .. lane
          if tonumber(redis.call('DECR', waiting)) <= 0 then redis.call('DEL', waiting) end
        end
      end
    end
    redis.call('HSET', record, 'st', 'dead', 'res', result_json, 'own', '')
    redis.call('SET', tombstone_prefix .. task_id, 'dead|' .. result_json, 'EX', tombstone_ttl_s)
    redis.call('ZREM', leases, record)
    redis.call('ZADD', pending_set, retry_at, record)
    local field = lane .. '|' .. (f[3] or '')
    count_to(metrics_total, metrics_minute, 'dead|' .. field .. '|expired')
    count_to(metrics_total, metrics_minute, 'completed|' .. lane)
    out[#out + 1] = record
    out[#out + 1] = f[7]
  end
end

local pending = redis.call('ZRANGEBYSCORE', pending_set, '-inf', now, 'LIMIT', 0, batch)
for _, record in ipairs(pending) do
  local f = redis.call('HMGET', record, 'st', 'msg')
  if f[1] == 'dead' and f[2] then
    redis.call('ZADD', pending_set, retry_at, record)
    out[#out + 1] = record
    out[#out + 1] = f[2]
  else
    redis.call('ZREM', pending_set, record)
  end
end
return out

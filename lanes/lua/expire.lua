-- expire.lua: waiting tasks whose deadline passed become `expired` dead letters (a batch).
--
-- KEYS[1] deadlines (zset: record -> deadline ms)   KEYS[2] expired pending rows (zset)
-- KEYS[3] leases   KEYS[4] active chats index   KEYS[5] metrics totals   KEYS[6] metrics minute
-- ARGV: 1 now ms, 2 most to expire, 3 result JSON of the dead letter (kept in the
--   record and its tombstone), 4 seconds to keep the tombstone, 5 queued lease ms,
--   6 chat key prefix ('dispatch:chat:'), 7 chat-waiting key prefix, 8 delayed-set
--   key prefix, 9 tombstone key prefix, 10 ms before a pending row is handed out
--   again, 11 how deep to search a lane list for the expired copy, 12 limits key
--   prefix, 13 lane key prefix
-- Returns a flat list {record, msg, ...}: the records expired now, then those
-- whose rows a caller took but did not confirm (ARGV[10] ago or more).
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
--    scored "hand out again at now + ARGV[10]"; the record keeps its message;
-- 2. the caller writes the DeadLetter row and the FAILURE result row (both
--    idempotent: get_or_create, upsert);
-- 3. the caller settles the records (forget.lua with KEYS[1] = the pending set),
--    which deletes them and their pending entries.
-- A caller that dies after 1 leaves the entry in the pending set: the next run
-- (any process) gets it back here and writes the rows again.

local now = tonumber(ARGV[1])
local out = {}
local window = tonumber(ARGV[11])
local retry_at = now + tonumber(ARGV[10])
lim_setup(ARGV[12], ARGV[13], KEYS[5], KEYS[6], now, KEYS[3], now + tonumber(ARGV[5]))

local function remove_copy(record, queue, msg, pub)
  local task_id = string.match(record, '([^:]+)$')
  local mark = string.find(msg, '\0', 1, true)
  local copy = string.sub(msg, 1, mark - 1) .. task_id .. '.' .. pub .. string.sub(msg, mark + 1)
  if redis.call('LPOS', queue, copy, 'RANK', -1, 'MAXLEN', window) then
    redis.call('LREM', queue, -1, copy)
  end
end

local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
for _, record in ipairs(due) do
  redis.call('ZREM', KEYS[1], record)
  local f = redis.call('HMGET', record, 'st', 'lane', 'type', 'chat', 'q', 'pub', 'msg', 'lim', 'lw')
  local st, lane, chat = f[1], f[2], f[4]
  if st == 'queued' or st == 'retry' or st == 'limited' or st == 'scheduled' then
    local task_id = string.match(record, '([^:]+)$')
    if st == 'retry' or st == 'scheduled' then
      -- (A scheduled task behind its chat's head is not in the delayed set: ZREM does nothing.)
      redis.call('ZREM', ARGV[8] .. lane, record)
    elseif st == 'limited' then
      if f[9] and redis.call('ZREM', f[9] .. ':w', record) == 1 then lim_count(f[9], -1) end
      lim_lane_waiting(lane, -1)
    elseif f[6] and f[6] ~= '0' then
      remove_copy(record, f[5], f[7], f[6])
    end
    if st == 'queued' and f[8] then lim_release(record, f[8]) end
    if chat and chat ~= '' then
      local base = ARGV[6] .. '{' .. chat .. '}:'
      local queue = base .. 'q'
      if redis.call('LINDEX', queue, 0) == task_id then
        hand_over(queue, chat, base .. 't:', KEYS[4], KEYS[3], now + tonumber(ARGV[5]), ARGV[7])
      elseif redis.call('LREM', queue, 1, task_id) > 0 then
        if tonumber(redis.call('ZINCRBY', KEYS[4], -1, chat)) <= 0 then redis.call('ZREM', KEYS[4], chat) end
        if (st == 'queued' and (f[6] or '0') == '0') or st == 'scheduled' then
          local waiting = ARGV[7] .. lane
          if tonumber(redis.call('DECR', waiting)) <= 0 then redis.call('DEL', waiting) end
        end
      end
    end
    redis.call('HSET', record, 'st', 'dead', 'res', ARGV[3], 'own', '')
    redis.call('SET', ARGV[9] .. task_id, 'dead|' .. ARGV[3], 'EX', tonumber(ARGV[4]))
    redis.call('ZREM', KEYS[3], record)
    redis.call('ZADD', KEYS[2], retry_at, record)
    local field = lane .. '|' .. (f[3] or '')
    count_to(KEYS[5], KEYS[6], 'dead|' .. field .. '|expired')
    count_to(KEYS[5], KEYS[6], 'completed|' .. lane)
    out[#out + 1] = record
    out[#out + 1] = f[7]
  end
end

local pending = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
for _, record in ipairs(pending) do
  local f = redis.call('HMGET', record, 'st', 'msg')
  if f[1] == 'dead' and f[2] then
    redis.call('ZADD', KEYS[2], retry_at, record)
    out[#out + 1] = record
    out[#out + 1] = f[2]
  else
    redis.call('ZREM', KEYS[2], record)
  end
end
return out

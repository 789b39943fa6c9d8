-- admit.lua: admission of one dispatch, and its publish, in one atomic step.
--
-- KEYS[1]  config version        KEYS[2]  task record (hash)
-- KEYS[3]  leases (zset)         KEYS[4]  idempotency key (string hash) or unused
-- KEYS[5]  chat queue (list)     KEYS[6]  lane's chat-waiting counter
-- KEYS[7]  lane delayed (zset)   KEYS[8]  metrics totals (hash)
-- KEYS[9]  metrics minute (hash) KEYS[10] active chats index (zset)
-- KEYS[11..20] the lane's ten priority lists (kombu priority 0..9)
-- ARGV: 1 expected config version, 2 now ms, 3 task id, 4 message (NUL marks
--   the delivery tag's place), 5 kombu priority 0..9, 6 accepting 0/1,
--   7 lane capacity, 8 chat id or '', 9 chat queue size, 10 payload digest or ''
--   (no idempotency key), 11 idempotency window s, 12 queued lease ms,
--   13 lane, 14 task type, 15 '1' to take over the idempotency key (a requeue;
--   its task id is derived from the dead letter, so a task record of that id
--   already here means an earlier requeue of the same row: answer 'dup')
-- KEYS[21] metrics of the previous minute (for the lane's recent completion rate)
-- KEYS[22] the idempotency key in its old, ambiguous format: read (never written)
--   when KEYS[4] is absent, until keys stored before the upgrade have expired
-- KEYS[23] deadlines of waiting tasks (zset)   KEYS[24] paused lanes (set)
-- KEYS[25] the lane's live consumers (zset: worker -> heartbeat expiry ms; lanes.consumers)
-- ARGV[16] the task's deadline, epoch ms
-- ARGV[17] the task's limit instance bases, newline-separated ('' when its type
--   names no limits: then nothing below touches a limit key), ARGV[18] limits key
--   prefix (lanes.keys.LIMIT_PREFIX), ARGV[19] lane key prefix (lanes.keys.LANE_PREFIX)
-- KEYS[26] the lane's count of tasks waiting on a limit (not read here since issue 16)
-- (No key is written for a cancel: a cancel by task id finds a chat-scoped record in the
--   deadlines and leases sets, lanes.records; the idempotency key keeps the task's chat.)
-- ARGV[20] when the task is due, epoch ms ('0': now, the plain dispatch). A task
--   sent for later (countdown / eta) is stored with st 'scheduled' and its due
--   time in the record's ``eta`` field; runnable (not chat-scoped, or its chat's
--   head) it waits in the lane's delayed set (KEYS[7], where retries wait) with a
--   lease at due + queued lease, and promote.lua publishes it when due; behind its
--   chat's head it waits in the chat's queue like any message (hand_over parks it).
-- ARGV[21] '1' to read the lane's completions, handler seconds, paused flag and live
--   consumers ('0': the caller has them from a recent call; they come back '')
-- The depth is the lane's count of tasks not claimed yet (``<ARGV[19]><lane>:waiting``,
--   kept with the deadlines set: waiting_add in _lib.lua); KEYS[26] and the lane lists'
--   lengths are no longer read (their LLENs were ten commands a dispatch).
-- Returns {'stale', version} | {'dup', task_id} | {'conflict', task_id}
--   | {'rej', reason, depth} | {'ok', position, depth, completed_this_minute,
--   completed_previous_minute, ahead, busy_s_this_minute, busy_s_previous_minute,
--   paused 0/1, live_consumers, waits_on (limit instance base or ''),
--   waiting_ahead, paused_ms}
-- ``ahead``: the lane's tasks waiting before this one (any priority, since issue 16:
-- the same as depth); ``busy_s``: the
-- handler seconds the lane's workers spent in that minute (finish.lua).
--
-- Every accepted task enters the deadlines set, published or waiting behind its
-- chat's head: expire.lua makes it an ``expired`` dead letter at its deadline
-- if no worker has claimed it by then.
--
-- Because Redis runs a script alone, a dispatch appending to a chat and a worker
-- handing the chat over (finish.lua) can never interleave: the seed's race, where
-- a hand-over deleted a queue that a submit had just found, cannot happen.

local version = redis.call('GET', KEYS[1]) or '0'
if version ~= ARGV[1] then
  return {'stale', version}
end

local task_id, chat_id, digest = ARGV[3], ARGV[8], ARGV[10]
local lane, ttype = ARGV[13], ARGV[14]
local field_base = lane .. '|' .. ttype

if ARGV[15] == '1' and redis.call('EXISTS', KEYS[2]) == 1 then
  return {'dup', task_id}
end

local function count(kind, extra)
  count_to(KEYS[8], KEYS[9], kind .. '|' .. field_base .. (extra or ''))
end

if digest ~= '' and ARGV[15] ~= '1' then
  local earlier = redis.call('HMGET', KEYS[4], 'task', 'digest')
  if not earlier[1] and KEYS[22] then
    earlier = redis.call('HMGET', KEYS[22], 'task', 'digest')
  end
  if earlier[1] then
    if earlier[2] ~= digest then
      count('rejected', '|idempotency_conflict')
      return {'conflict', earlier[1]}
    end
    return {'dup', earlier[1]}
  end
end

-- The lane's depth: its tasks not claimed yet (waiting_add in _lib.lua), this one counted in now.
local waiting_key = ARGV[19] .. lane .. ':waiting'
local depth = redis.call('INCR', waiting_key) - 1

local function reject(reason)
  if tonumber(redis.call('DECR', waiting_key)) < 0 then redis.call('DEL', waiting_key) end
  count('rejected', '|' .. reason)
  return {'rej', reason, depth}
end

if ARGV[6] ~= '1' then return reject('lane_closed') end
if depth >= tonumber(ARGV[7]) then return reject('lane_full') end

local now = tonumber(ARGV[2])
local position = depth + 1
local publish = true
if chat_id ~= '' then
  local backlog = redis.call('LLEN', KEYS[5])
  if backlog >= tonumber(ARGV[9]) then return reject('chat_queue_full') end
  redis.call('RPUSH', KEYS[5], task_id)
  redis.call('ZINCRBY', KEYS[10], 1, chat_id)
  position = backlog + 1
  if backlog > 0 then
    publish = false
    redis.call('INCR', KEYS[6])
  end
end

-- Every task waiting in the lane is counted ahead, whatever its priority (an estimate's input).
local ahead = depth
local queue_key = KEYS[11 + tonumber(ARGV[5])]
local due = tonumber(ARGV[20])
-- An unlimited task due now that is its chat's head (or has no chat) is published right
-- here: publish_record's work, without reading back the record just written.
local direct = publish and ARGV[17] == '' and due <= 0
local msg = ARGV[4]
redis.call('HSET', KEYS[2], 'msg', msg, 'q', queue_key, 'lane', lane, 'type', ttype,
  'st', due > 0 and 'scheduled' or 'queued', 'att', '1', 'dlv', '0', 'chat', chat_id,
  'pub', direct and '1' or '0', 'dl', ARGV[16], 'own', '')
redis.call('ZADD', KEYS[23], tonumber(ARGV[16]), KEYS[2])  -- counted in the lane's waiting count above
if due > 0 then
  -- Sent for later (the plain path pays nothing for this): runnable now, it waits
  -- in the delayed set; behind its chat's head, in the chat's queue (hand_over).
  redis.call('HSET', KEYS[2], 'eta', ARGV[20], 'dq', KEYS[7])
  if publish then
    redis.call('ZADD', KEYS[7], due, KEYS[2])
    redis.call('ZADD', KEYS[3], due + tonumber(ARGV[12]), KEYS[2])
  end
  publish = false
end
if ARGV[17] ~= '' then
  redis.call('HSET', KEYS[2], 'lim', ARGV[17], 'kp', ARGV[5])
  if publish then
    lim_setup(ARGV[18], ARGV[19], KEYS[8], KEYS[9], now, KEYS[3], now + tonumber(ARGV[12]))
    gate_publish(KEYS[2], ARGV[17], lane, ARGV[5])
  end
elseif direct then
  local mark = string.find(msg, '\0', 1, true)
  redis.call('LPUSH', queue_key, string.sub(msg, 1, mark - 1) .. task_id .. '.1' .. string.sub(msg, mark + 1))
  redis.call('ZADD', KEYS[3], now + tonumber(ARGV[12]), KEYS[2])
end
if digest ~= '' then
  -- Its chat too (same command): a cancel by the key finds a chat-scoped record without a scan.
  redis.call('HSET', KEYS[4], 'task', task_id, 'digest', digest, 'chat', chat_id)
  redis.call('EXPIRE', KEYS[4], tonumber(ARGV[11]))
end
-- 'dispatched' is counted by the caller, in process (lanes.counters), on an 'ok' reply.
-- A task a limit did not admit: the instance it waits on, how many wait there
-- before it, and the instance's Retry-After pause (admission's estimate). Nothing
-- is read for a type that names no limit.
local waits_on, waiting_ahead, paused_ms = '', 0, 0
if ARGV[17] ~= '' then
  waits_on = redis.call('HGET', KEYS[2], 'lw') or ''
  if waits_on ~= '' then
    waiting_ahead = redis.call('ZRANK', waits_on .. ':w', KEYS[2]) or 0
    paused_ms = math.max(0, redis.call('PTTL', waits_on .. ':p'))
  end
end
-- The lane's completions, handler seconds, paused flag and live consumers: read only
-- when the caller has none fresh (ARGV[21] '1'); else '' and the caller uses what it read lately.
local done, prev, paused, consumers = {'', ''}, {'', ''}, '', ''
if ARGV[21] ~= '0' then
  local done_field, busy_field = 'completed|' .. lane, 'busy|' .. lane
  done = redis.call('HMGET', KEYS[9], done_field, busy_field)
  prev = redis.call('HMGET', KEYS[21], done_field, busy_field)
  paused = redis.call('SISMEMBER', KEYS[24], lane)
  consumers = redis.call('ZCOUNT', KEYS[25], now, '+inf')
end
return {'ok', position, depth, done[1] or '0', prev[1] or '0', ahead, done[2] or '0', prev[2] or '0',
  paused, consumers, waits_on, waiting_ahead, paused_ms}

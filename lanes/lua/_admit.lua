-- _admit.lua: admission of one dispatch (admit_one), included by admit.lua, which runs
-- it for each item of a chunk (a chunk of one for dispatch.delay). ``c`` is the chunk's
-- named KEYS and ARGV, ``it`` the item's (admit.lua's header names both); the config
-- version is checked by admit.lua, once a call.
--
-- ``pend`` nil: every write is made at once (a chunk of one). A table: an item
-- published directly (unlimited, due now, its chat's head or no chat) defers
-- the lane's writes that many items share to pend_flush: the waiting count's
-- INCR (one INCRBY), the deadlines ZADD (one; pend.leases is empty since no direct publish
-- writes a queued lease) and the lane
-- list's LPUSH (one per priority list, the items in their order, so the list
-- holds them as one LPUSH each would have left them) and the lane's doorbell's
-- ring (_lib.lua), once a call, and only for a list that was empty. Nothing in a call reads
-- what is deferred except the waiting count, which ``pend`` carries; an item
-- that takes another path (a limit, sent for later) flushes first, so the
-- helpers it calls see every earlier item's writes. Everything an item reads
-- back (its record, idempotency key, chat queue) is still written at once, so
-- two items of one chunk see each other like two dispatch.delay calls.
--
-- What a plain item never runs (pend_flush and the rest of the deferred writes, the refusals, a debounce's
-- replacement, a limit's gate) is in _admit_rare.lua, reached as ``admit_rare().fn``: made only by a call
-- that needs it (admit.lua's ``--! lazy`` line).

-- Returns the item's reply as values, not a table (admit.lua builds the one it sends):
-- status, then ('dup'|'conflict') task id, ('rej') reason and depth, or ('ok') position,
-- depth, ahead, waits_on (limit instance base or ''), waiting_ahead, paused_ms and, when
-- ``read`` (the first item admitted of a call that asks), the lane's estimate inputs, then the
-- id and chat of the task a debounce replaced (nil: none)
-- (admit.lua's header). Scores are written to ZADD as the strings they came as (the
-- deadline; the lease's, once a call in ``pend``): a number made a string again costs a
-- printf and a strtod each way, a fifth of a plain item's Redis time.
local function admit_one(c, it, pend, read)
local task_id, chat_id, digest, record = it.task_id, it.chat, it.digest, it.record

if c.replace_idempotency and redis.call('EXISTS', record) == 1 then
  return 'dup', task_id
end

if digest ~= '' and not c.replace_idempotency then
  local earlier = redis.call('HMGET', it.idempotency, 'task', 'digest')
  if not earlier[1] then
    earlier = redis.call('HMGET', it.legacy_idempotency, 'task', 'digest')
  end
  if earlier[1] then
    if earlier[2] ~= digest then
      admit_rare().admit_count(c, 'rejected', '|idempotency_conflict')
      return 'conflict', earlier[1]
    end
    return 'dup', earlier[1]
  end
end

-- Throttle / debounce (tasks.dedupe): one decision on the task its dedupe key holds, if still in force.
local held = nil
if it.dedupe_key then
  held = redis.call('HMGET', it.dedupe_key, 'task', 'rec', 'chat', 'until')
  if not held[1] or (tonumber(held[4]) or 0) <= tonumber(c.now_ms) then
    held = nil
  elseif c.dedupe == 'throttle' then
    return 'dup', held[1]  -- the first in the window runs, whatever this one's payload
  else
    local st = redis.call('HGET', held[2], 'st')
    if st ~= 'scheduled' and st ~= 'queued' and st ~= 'limited' then held = nil end  -- started: plain
  end
end

local due = it.due_ms == '0' and 0 or tonumber(it.due_ms)
local waiting_key = c.lane_prefix .. c.lane .. LANE_WAITING_SUFFIX
-- Deferred writes serve an item published directly; any other flushes what is pending first.
if pend and (it.limits ~= '' or due > 0) then
  admit_rare().pend_flush(pend, waiting_key, c.deadlines, c.leases)
  pend = nil
end

-- The lane's depth: its tasks not claimed yet (waiting_add in _lib.lua), this one counted in now.
local depth
if pend then
  if not pend.base then pend.base = tonumber(redis.call('GET', waiting_key) or '0') end
  depth = math.max(0, pend.base + pend.add)
  pend.add = pend.add + 1
else
  depth = redis.call('INCR', waiting_key) - 1
end

if c.accepting ~= '1' then return admit_rare().admit_reject(c, pend, waiting_key, depth, 'lane_closed') end
if depth >= c.capacity then return admit_rare().admit_reject(c, pend, waiting_key, depth, 'lane_full') end
-- A token's tasks waiting in the lane (_lib.lua's caller_of) at most its share (``caller_quota``, 0: none).
local caller = caller_of(record)
if caller and tonumber(c.caller_quota) > 0 then
  local owned
  if pend then
    if not pend.owned[caller] then
      pend.owned[caller] = tonumber(redis.call('HGET', c.lane_prefix .. c.lane .. LANE_CALLERS_SUFFIX, caller) or '0')
    end
    owned = pend.owned[caller] + (pend.callers[caller] or 0)
  else
    owned = tonumber(redis.call('HGET', c.lane_prefix .. c.lane .. LANE_CALLERS_SUFFIX, caller) or '0')
  end
  if owned >= tonumber(c.caller_quota) then
    return admit_rare().admit_reject(c, pend, waiting_key, depth, 'caller_quota')
  end
end

-- A debounce replaces the task still waiting for its key (cancel.lua's cancel_record): only once
-- this one's own checks passed, so a refusal leaves the earlier one as it was.
local replaced, replaced_chat = nil, nil
if held then
  if chat_id ~= '' then
    local frees = held[3] == chat_id and 1 or 0
    if redis.call('LLEN', it.chat_queue) - frees >= tonumber(c.chat_queue_size) then
      return admit_rare().admit_reject(c, pend, waiting_key, depth, 'chat_queue_full')
    end
  end
  replaced, replaced_chat = admit_rare().replace_held(c, held[2], held[1], task_id)
end

local position = depth + 1
local publish = true
if chat_id ~= '' then
  local backlog = redis.call('LLEN', it.chat_queue)
  if backlog >= tonumber(c.chat_queue_size) then
    return admit_rare().admit_reject(c, pend, waiting_key, depth, 'chat_queue_full')
  end
  redis.call('RPUSH', it.chat_queue, task_id)
  redis.call('ZINCRBY', c.chats, 1, chat_id)
  position = backlog + 1
  if backlog > 0 then
    publish = false
    redis.call('INCR', c.chat_waiting)
  end
end

-- Every task waiting in the lane is counted ahead, whatever its priority (an estimate's input).
local ahead = depth
-- Its list: kombu priority '0'..'9' (one digit) is list 1..10, its byte less 47 (no strtod, as tonumber would run).
local queue_key = c.lists[string.byte(it.kombu_priority) - 47]
-- An unlimited task due now that is its chat's head (or has no chat) is published right
-- here: publish_record's work, without reading back the record just written.
local direct = publish and it.limits == '' and due <= 0
local msg = it.message
redis.call('HSET', record, 'msg', msg, 'q', queue_key, 'lane', c.lane, 'type', c.task_type,
  'st', due > 0 and 'scheduled' or 'queued', 'att', '1', 'dlv', '0', 'chat', chat_id,
  'pub', direct and '1' or '0', 'dl', it.deadline_ms, 'own', '')
-- Counted in the lane's waiting count above.
if pend then
  local d = pend.deadlines
  d[#d + 1] = it.deadline_ms
  d[#d + 1] = record
  if caller then
    pend.callers[caller] = (pend.callers[caller] or 0) + 1
    pend.lane_prefix, pend.lane = c.lane_prefix, c.lane
  end
else
  redis.call('ZADD', c.deadlines, it.deadline_ms, record)
  if caller then caller_move(c.lane_prefix, c.lane, caller, 1) end
end
if due > 0 then
  -- Sent for later (the plain path pays nothing for this): runnable now, it waits
  -- in the delayed set; behind its chat's head, in the chat's queue (hand_over).
  redis.call('HSET', record, 'eta', it.due_ms, 'dq', c.delayed)
  if publish then
    redis.call('ZADD', c.delayed, due, record)
    redis.call('ZADD', c.leases, due + tonumber(c.queued_lease_ms), record)
  end
  publish = false
end
if it.limits ~= '' then
  redis.call('HSET', record, 'lim', it.limits, 'kp', it.kombu_priority)
  if publish then admit_rare().admit_gate(c, record, it) end
elseif direct then
  local tagged = list_item(record, '1')  -- text: a number would be formatted by sprintf
  if pend then
    local list = pend.lists[queue_key]
    if not list then
      list = {}
      pend.lists[queue_key] = list
      pend.order[#pend.order + 1] = queue_key
    end
    list[#list + 1] = tagged
  else
    if rings_for(redis.call('LPUSH', queue_key, tagged), 1) then ring(bell_of(queue_key), bell_bit(queue_key)) end
  end
  -- No queued lease while its copy waits in the list: the pop that takes it writes one (pop_more.lua),
  -- and audit.lua finds a copy lost from an empty list (docs/liveness.md).
end
if it.dedupe_key then
  -- A throttle's key is held for its window; a debounce's while its task may still wait (its deadline).
  local until_ms = c.dedupe == 'throttle' and string.format('%.0f', tonumber(c.now_ms) + tonumber(c.dedupe_window_ms))
    or it.deadline_ms
  redis.call('HSET', it.dedupe_key, 'task', task_id, 'rec', record, 'chat', chat_id, 'until', until_ms)
  redis.call('PEXPIREAT', it.dedupe_key, until_ms)
end
if digest ~= '' then
  -- Its chat too (same command): a cancel by the key finds a chat-scoped record without a scan.
  redis.call('HSET', it.idempotency, 'task', task_id, 'digest', digest, 'chat', chat_id)
  redis.call('EXPIRE', it.idempotency, tonumber(c.idempotency_window_s))
end
-- 'dispatched' is counted by the caller, in process (lanes.counters), on an 'ok' reply.
-- A task a limit did not admit: the instance it waits on, how many wait there
-- before it, and the instance's Retry-After pause (admission's estimate). Nothing
-- is read for a type that names no limit.
local waits_on, waiting_ahead, paused_ms = '', 0, 0
if it.limits ~= '' then
  waits_on = redis.call('HGET', record, 'lw') or ''
  if waits_on ~= '' then
    waiting_ahead = redis.call('ZRANK', waits_on .. LIMIT_WAITING_SUFFIX, record) or 0
    paused_ms = math.max(0, redis.call('PTTL', waits_on .. LIMIT_PAUSED_SUFFIX))
  end
end
-- The lane's paused flag, live consumers, completions and handler seconds: read only when
-- asked (``read``); else the caller uses what it read lately. Only a lane that drains (not
-- paused, a live consumer) has its completions read: the estimate of one that does not says
-- why, from those two alone (tasks.estimate), so a lane nobody serves, read at every call
-- (lanes/lua/admit.py's _healthy), costs a call two commands, not four.
local inputs = nil
if read then
  local paused = redis.call('SISMEMBER', c.paused_lanes, c.lane)
  local consumers = redis.call('ZCOUNT', c.consumers, c.now_ms, '+inf')
  if paused == 0 and consumers > 0 then
    local done_field, busy_field = 'completed|' .. c.lane, 'busy|' .. c.lane
    local done = redis.call('HMGET', c.metrics_minute, done_field, busy_field)
    local prev = redis.call('HMGET', c.metrics_previous_minute, done_field, busy_field)
    inputs = {done[1] or '0', prev[1] or '0', done[2] or '0', prev[2] or '0', paused, consumers}
  else
    inputs = {'0', '0', '0', '0', paused, consumers}
  end
end
return 'ok', position, depth, ahead, waits_on, waiting_ahead, paused_ms, inputs, replaced, replaced_chat
end

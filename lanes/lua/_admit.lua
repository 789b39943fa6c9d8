-- _admit.lua: admission of one dispatch (admit_one), included by admit.lua (one
-- dispatch a call) and admit_many.lua (a chunk of dispatch_many's items a call).
-- KEYS and ARGV are admit.lua's (its header); the config version is checked by
-- the caller, once a call.
--
-- ``pend`` nil: every write is made at once (admit.lua). A table: an item
-- published directly (unlimited, due now, its chat's head or no chat) defers
-- the lane's writes that many items share to pend_flush: the waiting count's
-- INCR (one INCRBY), the deadlines and leases ZADDs (one each) and the lane
-- list's LPUSH (one per priority list, the items in their order, so the list
-- holds them as one LPUSH each would have left them) and the lane's doorbell's
-- ring (_lib.lua), once a call. Nothing in a call reads
-- what is deferred except the waiting count, which ``pend`` carries; an item
-- that takes another path (a limit, sent for later) flushes first, so the
-- helpers it calls see every earlier item's writes. Everything an item reads
-- back (its record, idempotency key, chat queue) is still written at once, so
-- two items of one chunk see each other like two dispatch.delay calls.

local function pend_new()
  return {add = 0, base = nil, deadlines = {}, leases = {}, lists = {}, order = {}}
end

-- ``command key`` with the members of ``args``, in runs that fit Lua's stack (unpack).
local function call_in_runs(command, key, args)
  local run = 2000
  for i = 1, #args, run do
    redis.call(command, key, unpack(args, i, math.min(i + run - 1, #args)))
  end
end

local function pend_flush(pend, waiting_key, deadlines_key, leases_key)
  if pend.add ~= 0 then
    if tonumber(redis.call('INCRBY', waiting_key, pend.add)) < 0 then redis.call('DEL', waiting_key) end
  end
  call_in_runs('ZADD', deadlines_key, pend.deadlines)
  call_in_runs('ZADD', leases_key, pend.leases)
  -- One ring per lane doorbell for every list the call pushed to (a chunk is one lane's).
  local bells = {}
  for _, list in ipairs(pend.order) do
    call_in_runs('LPUSH', list, pend.lists[list])
    local bell = bell_of(list)
    bells[bell] = bit.bor(bells[bell] or 0, bell_bit(list))
  end
  for bell, bits in pairs(bells) do ring(bell, bits) end
  -- Reset in place (admit_one holds this table); base too, which pairs() of a fresh table would skip
  -- (nil): the next deferred item reads the waiting count again, with what was just written.
  pend.add, pend.base, pend.deadlines, pend.leases, pend.lists, pend.order = 0, nil, {}, {}, {}, {}
end

-- A count in the metrics hashes (KEYS 8 and 9) for the task type's lane and type.
local function admit_count(KEYS, field_base, kind, extra)
  count_to(KEYS[8], KEYS[9], kind .. '|' .. field_base .. (extra or ''))
end

-- A refusal after the task was counted in the lane's depth: count it out again.
local function admit_reject(KEYS, pend, waiting_key, field_base, depth, reason)
  if pend then
    pend.add = pend.add - 1
  elseif tonumber(redis.call('DECR', waiting_key)) < 0 then
    redis.call('DEL', waiting_key)
  end
  admit_count(KEYS, field_base, 'rejected', '|' .. reason)
  return 'rej', reason, depth
end

-- Returns admit.lua's reply as values, not a table (admit.lua makes it one; admit_many.lua
-- keeps what it sends): a table an item was a tenth of a chunk's garbage for Lua's collector.
-- Scores are written to ZADD as the strings they came as (ARGV 16 the deadline; the
-- lease's, once a call in ``pend``): a number made a string again costs a printf and a
-- strtod each way, a fifth of a plain item's Redis time.
local function admit_one(KEYS, ARGV, pend)
local task_id, chat_id, digest = ARGV[3], ARGV[8], ARGV[10]
local lane, ttype = ARGV[13], ARGV[14]
local field_base = lane .. '|' .. ttype

if ARGV[15] == '1' and redis.call('EXISTS', KEYS[2]) == 1 then
  return 'dup', task_id
end

if digest ~= '' and ARGV[15] ~= '1' then
  local earlier = redis.call('HMGET', KEYS[4], 'task', 'digest')
  if not earlier[1] and KEYS[22] then
    earlier = redis.call('HMGET', KEYS[22], 'task', 'digest')
  end
  if earlier[1] then
    if earlier[2] ~= digest then
      admit_count(KEYS, field_base, 'rejected', '|idempotency_conflict')
      return 'conflict', earlier[1]
    end
    return 'dup', earlier[1]
  end
end

local due = ARGV[20] == '0' and 0 or tonumber(ARGV[20])
-- Deferred writes serve an item published directly; any other flushes what is pending first.
if pend and (ARGV[17] ~= '' or due > 0) then
  pend_flush(pend, ARGV[19] .. lane .. ':waiting', KEYS[23], KEYS[3])
  pend = nil
end

-- The lane's depth: its tasks not claimed yet (waiting_add in _lib.lua), this one counted in now.
local waiting_key = ARGV[19] .. lane .. ':waiting'
local depth
if pend then
  if not pend.base then pend.base = tonumber(redis.call('GET', waiting_key) or '0') end
  depth = math.max(0, pend.base + pend.add)
  pend.add = pend.add + 1
else
  depth = redis.call('INCR', waiting_key) - 1
end

if ARGV[6] ~= '1' then return admit_reject(KEYS, pend, waiting_key, field_base, depth, 'lane_closed') end
if depth >= tonumber(ARGV[7]) then return admit_reject(KEYS, pend, waiting_key, field_base, depth, 'lane_full') end

local position = depth + 1
local publish = true
if chat_id ~= '' then
  local backlog = redis.call('LLEN', KEYS[5])
  if backlog >= tonumber(ARGV[9]) then
    return admit_reject(KEYS, pend, waiting_key, field_base, depth, 'chat_queue_full')
  end
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
-- An unlimited task due now that is its chat's head (or has no chat) is published right
-- here: publish_record's work, without reading back the record just written.
local direct = publish and ARGV[17] == '' and due <= 0
local msg = ARGV[4]
redis.call('HSET', KEYS[2], 'msg', msg, 'q', queue_key, 'lane', lane, 'type', ttype,
  'st', due > 0 and 'scheduled' or 'queued', 'att', '1', 'dlv', '0', 'chat', chat_id,
  'pub', direct and '1' or '0', 'dl', ARGV[16], 'own', '')
-- Counted in the lane's waiting count above.
if pend then
  local d = pend.deadlines
  d[#d + 1] = ARGV[16]
  d[#d + 1] = KEYS[2]
else
  redis.call('ZADD', KEYS[23], ARGV[16], KEYS[2])
end
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
    local now = tonumber(ARGV[2])
    lim_setup(ARGV[18], ARGV[19], KEYS[8], KEYS[9], now, KEYS[3], now + tonumber(ARGV[12]))
    gate_publish(KEYS[2], ARGV[17], lane, ARGV[5])
  end
elseif direct then
  local mark = string.find(msg, '\0', 1, true)
  local tagged = string.sub(msg, 1, mark - 1) .. task_id .. '.1' .. string.sub(msg, mark + 1)
  if pend then
    local list = pend.lists[queue_key]
    if not list then
      list = {}
      pend.lists[queue_key] = list
      pend.order[#pend.order + 1] = queue_key
    end
    list[#list + 1] = tagged
    if not pend.lease_until then
      pend.lease_until = string.format('%.0f', tonumber(ARGV[2]) + tonumber(ARGV[12]))
    end
    local l = pend.leases
    l[#l + 1] = pend.lease_until
    l[#l + 1] = KEYS[2]
  else
    redis.call('LPUSH', queue_key, tagged)
    ring(bell_of(queue_key), bell_bit(queue_key))
    redis.call('ZADD', KEYS[3], tonumber(ARGV[2]) + tonumber(ARGV[12]), KEYS[2])
  end
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
  consumers = redis.call('ZCOUNT', KEYS[25], ARGV[2], '+inf')
end
return 'ok', position, depth, done[1] or '0', prev[1] or '0', ahead, done[2] or '0', prev[2] or '0',
  paused, consumers, waits_on, waiting_ahead, paused_ms
end

-- _lib.lua: helpers prepended to every script by lanes.lua.loader (not run alone).
--
-- A task record is a hash: msg (the task's message, stored compact: lanes/messages.py's
-- build_message; the lane list holds ``list_item(record, pub)``), q (the lane list it is published to), lane, type,
-- st (queued|scheduled|running|retry|limited|done|dead), att (attempt), dlv (deliveries of this
-- attempt), own (worker running it), chat (chat id or ''), pub (publish count),
-- lim (limit instance bases, newline-separated; absent when the type has no
-- limits), kp (kombu priority, with lim), lw and ls (while limited: the base it
-- waits on and its waiting score),
-- res (outcome detail, once done or dead: kept until the worker stored the
-- result row and settled the record with forget.lua),
-- eta and dq (a task sent for later, admit.lua: its due time in ms and its lane's
-- delayed set; st is 'scheduled' until it is published). A scheduled task is
-- either in the delayed set (runnable, not due: promote.lua publishes it) or in
-- its chat's queue behind the head (hand_over parks it or publishes it).

-- Doorbells (lanes/transport.py, docs/liveness.md). A worker blocks on its lanes'
-- doorbells, never on their lists, and takes messages with pop_more.lua, which
-- names each one's record in the worker's in-hand set in the same call. So every
-- push onto an empty lane list rings the lane's doorbell (rings_for):
-- a list beside the lane's lists
-- (lanes.keys.lane_doorbell: the lane's name, which has no ':', and ':bell')
-- holding at most one token, the bits of the lane lists pushed since it was rung
-- (bit p: list ``lane:p``, kombu priority p), so the worker that takes it looks
-- only at those lists. ring returns nothing; it costs an LPUSH when the bell was empty (the
-- usual case: an idle worker blocks on it, or a busy one took the token), and when a token was
-- there already an RPOP of it and, unless this ring's bits hold all of it, an LSET of the two
-- merged (docs/redis-budget.md: one command a ring, from an LINDEX and an LPUSH).
local function bell_of(list)
  return (string.match(list, '^[^:]+')) .. DOORBELL_SUFFIX
end

local function bell_bit(list)
  return bit.lshift(1, tonumber(string.match(list, ':(%d+)$') or '0'))
end

local function ring(bell, bits)
  -- The push's reply tells whether a token was there. A script runs alone, so no BRPOP can take
  -- either token before the two are one again: a worker sees at most one token, as before.
  if redis.call('LPUSH', bell, bits) == 1 then return end
  local had = tonumber(redis.call('RPOP', bell)) or 1023  -- the older token (unreadable: every list)
  local merged = bit.bor(had, bits)
  if merged ~= bits then redis.call('LSET', bell, 0, merged) end
end

-- Whether a push of ``pushed`` messages (admission's, or publish_record's), after which the list holds ``length``, must
-- ring: only onto a list that was empty. A list that held messages was rung when its oldest
-- arrived, and until it is empty a token or a pop names it: the token holds its bit until a
-- worker takes it, that worker's pop_more empties the list or rings again for what it left
-- (chain wake). A token lost with a killed worker (or a push that did not ring) is no longer
-- made good by the next dispatch onto that list: the workers' poll takes it (about a second,
-- docs/liveness.md). Under a backlog a dispatch saves the ring's LINDEX (docs/redis-budget.md).
local function rings_for(length, pushed)
  return tonumber(length) <= pushed
end

-- A chat's key base, ``<chat prefix>{<chat id>}`` (lanes.keys.chat_*): its queue and records set are
-- this and CHAT_QUEUE_SUFFIX / CHAT_RECORDS_SUFFIX.
local function chat_tag(chat_prefix, chat)
  return chat_prefix .. '{' .. chat .. '}'
end

-- A lane list's item for a record's publish number ``pub``: the record named, not its
-- message (pop_more.lua reads the message from the record; the number tells a copy
-- from an older one, and makes the delivery tag ``<task id>.<pub>``).
local function list_item(record, pub)
  return record .. '#' .. pub
end

-- The record and publish number a lane list's item names (nil for a whole message:
-- one pushed by kombu or handed back by a worker, which starts with '{').
local function list_item_parts(item)
  if string.byte(item, 1) == 123 then return nil end
  return string.match(item, '^(.*)#(%d+)$')
end

-- Publish a record to its lane list (a fresh publish number), and give it a
-- lease after which the recovery sweep publishes it again. ``state`` is
-- the record's state from now on (default 'queued'; a finished record whose
-- result row may be missing keeps 'done'/'dead', so its copy only re-stores it).
local function publish_record(record, leases_key, lease_until, state)
  local queue = redis.call('HGET', record, 'q')
  if not queue then return false end
  local pub = redis.call('HINCRBY', record, 'pub', 1)
  if rings_for(redis.call('LPUSH', queue, list_item(record, pub)), 1) then
    ring(bell_of(queue), bell_bit(queue))
  end
  redis.call('HSET', record, 'st', state or 'queued', 'own', '')
  redis.call('ZADD', leases_key, lease_until, record)
  return true
end

-- Every accepted task no worker has claimed yet is in the deadlines set
-- (published, behind its chat's head, parked for a retry, or waiting on a
-- limit), and its lane keeps their count beside it (``<lane key prefix><lane>:waiting``,
-- lanes.keys.lane_waiting): admission's depth in one command instead of ten
-- LLENs and three more reads. A script changes the set only through
-- these two, so the count moves exactly when the set does (ZADD and ZREM say
-- whether they did). A count found below zero is dropped (never negative).
-- waiting_add returns the Redis commands it ran (scripts that report their cost).
--
-- A token's tasks (ids ``tk<token id>-...``, tasks/owners.py) are also counted per token, in
-- a hash beside the lane's count (``<lane key prefix><lane>:callers``, lanes.keys.lane_callers:
-- a field a token id): admission refuses a token past its share of the lane (caller_quota).
-- Moved here with the lane's count, so it too moves exactly when the set does; a field that
-- reaches 0 goes (below 0: dropped, never negative). callers_audit.lua recounts a lost one.
local function caller_of(record)
  -- A plain find first: most records name no token, and the pattern is tried at every position of the key.
  if not string.find(record, ':tk', 1, true) then return nil end
  return string.match(record, ':tk(%d+)%-[^:]*$')
end

local function caller_move(lane_prefix, lane, caller, by)
  local key = lane_prefix .. lane .. LANE_CALLERS_SUFFIX
  if tonumber(redis.call('HINCRBY', key, caller, by)) <= 0 then redis.call('HDEL', key, caller) end
end

local function waiting_add(deadlines, record, at, lane_prefix, lane)
  if redis.call('ZADD', deadlines, at, record) == 1 and lane and lane_prefix then
    redis.call('INCR', lane_prefix .. lane .. LANE_WAITING_SUFFIX)
    local caller = caller_of(record)
    if caller then
      caller_move(lane_prefix, lane, caller, 1)
      return 3
    end
    return 2
  end
  return 1
end

local function waiting_remove(deadlines, record, lane_prefix, lane)
  if redis.call('ZREM', deadlines, record) == 1 and lane and lane_prefix then
    local key = lane_prefix .. lane .. LANE_WAITING_SUFFIX
    if tonumber(redis.call('DECR', key)) < 0 then redis.call('DEL', key) end
    local caller = caller_of(record)
    if caller then caller_move(lane_prefix, lane, caller, -1) end
  end
end

-- waiting_remove for several records of one lane at once (a batched claim):
-- one ZREM and one DECRBY instead of two commands a record. Tokens' records are
-- looked up first (one ZMSCORE), so that only those the ZREM takes are counted out.
local function waiting_remove_all(deadlines, records, lane_prefix, lane)
  if #records == 0 then return end
  local marked, callers = {}, nil
  if lane and lane_prefix then
    for _, record in ipairs(records) do
      if caller_of(record) then marked[#marked + 1] = record end
    end
  end
  if #marked > 0 then
    callers = {}
    local scores = redis.call('ZMSCORE', deadlines, unpack(marked))
    for i, record in ipairs(marked) do
      if scores[i] then
        local caller = caller_of(record)
        callers[caller] = (callers[caller] or 0) + 1
      end
    end
  end
  local removed = redis.call('ZREM', deadlines, unpack(records))
  if removed > 0 and lane and lane_prefix then
    local key = lane_prefix .. lane .. LANE_WAITING_SUFFIX
    if tonumber(redis.call('DECRBY', key, removed)) < 0 then redis.call('DEL', key) end
    for caller, n in pairs(callers or {}) do caller_move(lane_prefix, lane, caller, -n) end
  end
end

local function count_to(total_key, minute_key, field)
  redis.call('HINCRBY', total_key, field, 1)
  -- The minute hash expires 20 minutes after its first count: set it once.
  if redis.call('HINCRBY', minute_key, field, 1) == 1 and redis.call('TTL', minute_key) < 0 then
    redis.call('EXPIRE', minute_key, 1200)
  end
end

-- A latency observation: one bucket count and the running sum, in seconds.
local function observe(total_key, minute_key, name, suffix, bucket, seconds)
  if bucket == '' then return end
  count_to(total_key, minute_key, name .. '|' .. suffix .. '|' .. bucket)
  redis.call('HINCRBYFLOAT', total_key, name .. '_sum|' .. suffix, seconds)
end

-- ---------------------------------------------------------------------------
-- Limits (flow control; key layout in lanes/keys.py, "limits" section).
--
-- A script that may publish, hand over or finish a task calls lim_setup first
-- (cheap: no Redis command); everything below runs only for a record whose
-- ``lim`` field is set, so an unlimited task pays no command for limits.
-- An *instance* is a base key B (``<prefix><name>:<value>``): B:b bucket,
-- B:f record keys holding a slot, B:w waiting records, B:p paused-until ms.
local LIM = {}

local function lim_setup(prefix, lane_prefix, total_key, minute_key, now, leases_key, lease_until)
  LIM.prefix, LIM.lane_prefix, LIM.total, LIM.minute = prefix, lane_prefix, total_key, minute_key
  LIM.now, LIM.leases, LIM.lease_until = now, leases_key, lease_until
  LIM.defs, LIM.tokens = {}, {}
end

local function lim_split(text)
  local out = {}
  for part in string.gmatch(text or '', '[^\n]+') do out[#out + 1] = part end
  return out
end

-- The limit name of an instance base (names hold no ':'), and its value.
local function lim_parts(base)
  local rest = string.sub(base, #LIM.prefix + 1)
  local colon = string.find(rest, ':', 1, true)
  return string.sub(rest, 1, colon - 1), string.sub(rest, colon + 1)
end

-- A limit's definition (decoded once per call), or false once it was removed.
local function lim_def(name)
  local d = LIM.defs[name]
  if d == nil then
    local raw = redis.call('HGET', LIM.prefix .. 'def', name)
    d = raw and cjson.decode(raw) or false
    LIM.defs[name] = d
  end
  return d
end

-- Keep the instance index (waiting + holding per base) in step; an idle base leaves it.
local function lim_count(base, delta)
  local name = lim_parts(base)
  local index = LIM.prefix .. LIMIT_INSTANCES_INFIX .. name
  if tonumber(redis.call('ZINCRBY', index, delta, base)) <= 0 then redis.call('ZREM', index, base) end
end

local function lim_due(base, at)
  redis.call('ZADD', LIM.prefix .. 'due', 'LT', at, base)
end

local function lim_lane_waiting(lane, delta)
  local key = LIM.lane_prefix .. lane .. LANE_LIMITED_SUFFIX
  if tonumber(redis.call('INCRBY', key, delta)) <= 0 then redis.call('DEL', key) end
end

-- Why ``base`` cannot take one more task now: nil (it can), 'held' (slots or the
-- fair-share window are full: a release wakes it) or the ms when it may (tokens, pause).
local function lim_refusal(base, name, d)
  local now = LIM.now
  local paused = tonumber(redis.call('GET', base .. LIMIT_PAUSED_SUFFIX) or '0')
  if paused > now then return paused end
  if d.fair_share then
    if redis.call('SCARD', LIM.prefix .. name .. ':' .. LIMIT_HOLDING_SUFFIX) >= (d.window or 32) then return 'held' end
  elseif d.max_in_flight and redis.call('SCARD', base .. LIMIT_HOLDING_SUFFIX) >= d.max_in_flight then
    return 'held'
  end
  if d.rate then
    local b = redis.call('HMGET', base .. LIMIT_BUCKET_SUFFIX, 't', 'ts')
    local t = tonumber(b[1] or d.burst)
    local ts = tonumber(b[2] or now)
    t = math.min(d.burst, t + math.max(0, now - ts) * d.rate / 1000)
    LIM.tokens[base] = t
    if t < 1 then return now + math.ceil((1 - t) * 1000 / d.rate) end
  end
  return nil
end

-- The first of ``bases`` that refuses a task now, with its refusal ('queue' when
-- others already wait there: first come first served), or nil when all admit.
-- ``from``: the base whose waiting head this is (its own queue is no obstacle).
local function lim_check(bases, from)
  for _, base in ipairs(bases) do
    local name = lim_parts(base)
    local d = lim_def(name)
    if d then
      if base ~= from and redis.call('EXISTS', base .. LIMIT_WAITING_SUFFIX) == 1 then return base, 'queue' end
      local refusal = lim_refusal(base, name, d)
      if refusal then return base, refusal end
    end
  end
  return nil
end

-- Every limit admitted the task: take a token from each bucket, a slot in each holding set.
local function lim_take(record, bases)
  local now = LIM.now
  for _, base in ipairs(bases) do
    local name = lim_parts(base)
    local d = lim_def(name)
    if d then
      if d.rate then
        local t = (LIM.tokens[base] or d.burst) - 1
        redis.call('HSET', base .. LIMIT_BUCKET_SUFFIX, 't', t, 'ts', now)
        -- Gone once it would be full again: an idle key leaves nothing behind.
        redis.call('PEXPIRE', base .. LIMIT_BUCKET_SUFFIX, math.ceil((d.burst - t) * 1000 / d.rate) + 1000)
        LIM.tokens[base] = nil
      end
      if redis.call('SADD', base .. LIMIT_HOLDING_SUFFIX, record) == 1 then lim_count(base, 1) end
      if d.fair_share then redis.call('SADD', LIM.prefix .. name .. ':' .. LIMIT_HOLDING_SUFFIX, record) end
      count_to(LIM.total, LIM.minute, 'lim_admitted|' .. name)
    end
  end
end

-- Put ``record`` in ``base``'s waiting set (score kept across moves), waking it when due.
local function lim_enqueue(record, base, refusal, score)
  if redis.call('ZADD', base .. LIMIT_WAITING_SUFFIX, score, record) == 1 then lim_count(base, 1) end
  if type(refusal) == 'number' then lim_due(base, refusal) end
  local name, value = lim_parts(base)
  local d = lim_def(name)
  if d and d.fair_share then
    local ring = LIM.prefix .. LIMIT_RING_INFIX .. name
    if not redis.call('LPOS', ring, value) then redis.call('RPUSH', ring, value) end
  end
  redis.call('HSET', record, 'st', 'limited', 'lw', base)
end

-- A task becomes runnable (admission, a chat hand-over, a due retry): publish it
-- if every limit in ``lim`` admits it now, else it waits in Redis (no lease, no
-- message in the broker, counted as throttled once). Returns true when published.
local function gate_publish(record, lim, lane, kp)
  local bases = lim_split(lim)
  local base, refusal = lim_check(bases, nil)
  if not base then
    lim_take(record, bases)
    return publish_record(record, LIM.leases, LIM.lease_until)
  end
  local seq = redis.call('INCR', LIM.prefix .. 'seq')
  local score = string.format('%.0f', (tonumber(kp) or 0) * 1e13 + seq)
  redis.call('HSET', record, 'ls', score)
  lim_enqueue(record, base, refusal, score)
  redis.call('ZREM', LIM.leases, record)
  lim_lane_waiting(lane, 1)
  count_to(LIM.total, LIM.minute, 'lim_throttled|' .. (lim_parts(base)))
  return false
end

-- Try the head ``record`` of ``from``'s waiting set: 'published', 'moved' (another
-- of its limits refuses: it waits there now), 'refused' (``from`` itself) or 'gone'.
local function lim_try_head(record, from)
  local f = redis.call('HMGET', record, 'st', 'lim', 'lane', 'ls')
  if f[1] ~= 'limited' then
    redis.call('ZREM', from .. LIMIT_WAITING_SUFFIX, record)
    lim_count(from, -1)
    return 'gone'
  end
  local bases = lim_split(f[2])
  local base, refusal = lim_check(bases, from)
  if base == from then
    if type(refusal) == 'number' then lim_due(from, refusal) end
    return 'refused'
  end
  redis.call('ZREM', from .. LIMIT_WAITING_SUFFIX, record)
  lim_count(from, -1)
  if base then
    lim_enqueue(record, base, refusal, f[4])
    return 'moved'
  end
  lim_take(record, bases)
  redis.call('HDEL', record, 'lw', 'ls')
  publish_record(record, LIM.leases, LIM.lease_until)
  lim_lane_waiting(f[3], -1)
  return 'published'
end

-- Fair share: serve the keys with a backlog in turn (a key of weight w gets up to
-- w tasks a turn) while the limit-wide window has room.
local function lim_fair_drain(name, d, budget)
  local ring = LIM.prefix .. LIMIT_RING_INFIX .. name
  local credit = LIM.prefix .. LIMIT_CREDIT_INFIX .. name
  local wide = LIM.prefix .. name .. ':'
  local steps = 2 * budget + redis.call('LLEN', ring)
  while budget > 0 and steps > 0 do
    steps = steps - 1
    if redis.call('SCARD', wide .. LIMIT_HOLDING_SUFFIX) >= (d.window or 32) then return end
    local key = redis.call('LINDEX', ring, 0)
    if not key then return end
    local base = wide .. key
    local head = redis.call('ZRANGE', base .. LIMIT_WAITING_SUFFIX, 0, 0)[1]
    if not head then
      redis.call('LPOP', ring)
      redis.call('HDEL', credit, key)
    else
      local outcome = lim_try_head(head, base)
      if outcome == 'published' then
        budget = budget - 1
        local weight = tonumber((d.weights or {})[key]) or 1
        if redis.call('EXISTS', base .. LIMIT_WAITING_SUFFIX) == 0 then
          redis.call('LPOP', ring)
          redis.call('HDEL', credit, key)
        elseif redis.call('HINCRBY', credit, key, 1) >= weight then
          redis.call('HDEL', credit, key)
          redis.call('LMOVE', ring, ring, 'LEFT', 'RIGHT')
        end
      elseif outcome == 'refused' then
        -- This key's own rate or pause: the next key's turn (its due entry wakes it).
        redis.call('HDEL', credit, key)
        redis.call('LMOVE', ring, ring, 'LEFT', 'RIGHT')
      end
    end
  end
  if budget == 0 and redis.call('EXISTS', ring) == 1 then lim_due(wide, LIM.now) end
end

-- Publish waiting heads of ``base`` in order while its limits admit them (at most ``budget``).
local function lim_drain(base, budget)
  local name = lim_parts(base)
  local d = lim_def(name)
  if d and d.fair_share then return lim_fair_drain(name, d, budget) end
  while budget > 0 do
    local head = redis.call('ZRANGE', base .. LIMIT_WAITING_SUFFIX, 0, 0)[1]
    if not head then return end
    if lim_try_head(head, base) == 'refused' then return end
    budget = budget - 1
  end
  if redis.call('EXISTS', base .. LIMIT_WAITING_SUFFIX) == 1 then lim_due(base, LIM.now) end
end

--- A task gives back its slots (finished, parked for a retry, expired, or leaked):
-- each freed instance hands them on to its waiting heads in the same call.
local function lim_release(record, lim)
  local bases = lim_split(lim)
  for _, base in ipairs(bases) do
    if redis.call('SREM', base .. LIMIT_HOLDING_SUFFIX, record) == 1 then lim_count(base, -1) end
    local name = lim_parts(base)
    redis.call('SREM', LIM.prefix .. name .. ':' .. LIMIT_HOLDING_SUFFIX, record)
  end
  for _, base in ipairs(bases) do lim_drain(base, 20) end
end

-- Now in ms from Redis's clock, for hand_over called by a script that did not call lim_setup.
local function scheduled_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Hand a chat on after its head reached a terminal state: pop the head, and
-- publish the next message if there is one (through its limits' gate, if it has
-- limits: the script called lim_setup with the same leases key and lease). A next
-- message sent for later that is not due yet goes to its lane's delayed set
-- instead (still 'scheduled'), with a lease at its due time plus the queued lease.
-- ``head``: the queue's first two ids as the caller read them (LRANGE 0 1: finish_record), or nil (read
-- here). A queue this pop empties leaves the active chats index at once (its count there is its
-- queue's length: 0), without the ZINCRBY: finishing a chat's only message costs LRANGE, LPOP, ZREM.
-- Returns the next task id or ''.
local function hand_over(chat_queue, chat_id, record_prefix, chats_index, leases_key, lease_until,
                         chat_waiting_prefix, head)
  redis.call('LPOP', chat_queue)
  local next_id
  if head then
    next_id = head[2]
  else
    next_id = redis.call('LINDEX', chat_queue, 0)
  end
  if not next_id then
    redis.call('ZREM', chats_index, chat_id)
    return ''
  end
  if tonumber(redis.call('ZINCRBY', chats_index, -1, chat_id)) <= 0 then
    redis.call('ZREM', chats_index, chat_id)
  end
  local next_record = record_prefix .. next_id
  local f = redis.call('HMGET', next_record, 'lane', 'lim', 'kp', 'st', 'eta', 'dq')
  local next_lane = f[1]
  local now = LIM.now or scheduled_now()
  if f[4] == 'scheduled' and tonumber(f[5]) > now then
    -- Sent for later and not due yet: it waits in its lane's delayed set (as a retry does).
    redis.call('ZADD', f[6], tonumber(f[5]), next_record)
    redis.call('ZADD', leases_key, tonumber(f[5]) + (lease_until - now), next_record)
  elseif f[2] and f[2] ~= '' then
    gate_publish(next_record, f[2], next_lane, f[3])
  else
    publish_record(next_record, leases_key, lease_until)
  end
  if next_lane then
    local waiting = chat_waiting_prefix .. next_lane
    if tonumber(redis.call('DECR', waiting)) <= 0 then redis.call('DEL', waiting) end
  end
  return next_id
end

-- Finish one task that reached a terminal state, and hand its chat on: finish.lua
-- for one task, finish_batch.lua for each succeeded item of a batch (the same
-- steps, so a batch never changes what finishing means). ``c`` holds the call's
-- constants: leases, deadlines (or nil), lane_prefix, chats (the active chats
-- index), tomb_ttl_s, settle_until and handover_until (ms: the settle lease of a
-- task finished without a claim, the queued lease of the chat's next message),
-- chat_waiting_prefix; the caller ran lim_setup with the same leases key.
-- ``owner``: the owner that claimed this attempt ('' when it ends without a
-- claim: poison, expired before it ran). ``chat_queue`` / ``chat_records``: the
-- chat's queue and record prefix (used only when ``chat`` is not '').
-- Returns 'ok', next task id or '' | 'gone' | 'already', state | 'taken', owner.
local function finish_record(c, record, task_id, outcome, result, owner, tombstone, chat, chat_queue, chat_records)
  local f = redis.call('HMGET', record, 'st', 'lane', 'own', 'lim')
  local st = f[1]
  if not st then return 'gone' end
  if st == 'done' or st == 'dead' or st == 'cancelled' then return 'already', st end
  -- Another worker claimed the task since (our lease ran out while Redis was
  -- away): that attempt will finish it, so this one must not hand the chat over under it.
  if owner ~= '' and st == 'running' and f[3] ~= owner then return 'taken', f[3] end
  -- The record keeps the outcome, under a lease, until the worker has stored the
  -- result row and settles it (forget.lua, batched): a worker killed in between
  -- has its message republished by the sweep when the lease runs out, and that
  -- delivery stores the result from here (start.lua answers 'finished'). The
  -- broker keeps no copy of a running task (lanes.transport), so this lease is
  -- what brings the result row back. Settled, the record goes away with the
  -- task, so a finished chat leaves no key behind; a small tombstone outside the
  -- chat's keys answers any copy still in the broker for a while.
  redis.call('HSET', record, 'st', outcome, 'res', result, 'own', '')
  -- ``tombstone`` nil: the caller knows the task's type keeps a result row for this outcome, stored
  -- before the record is settled (tasks.results.store_rows), and every reader of a tombstone (a late
  -- copy's claim: 'gone' then, never run; a cancel, the task search) reads that row once the record
  -- is gone: one SET a task less (docs/redis-budget.md). A type that keeps no row always gets one.
  if tombstone then redis.call('SET', tombstone, outcome .. '|' .. result, 'EX', c.tomb_ttl_s) end
  -- A task claimed by this attempt keeps the lease of its claim: set by the claim,
  -- renewed by its process's beat every third of it while it ran, so at least two
  -- thirds of DISPATCH_LEASE_S are left (settling takes a fraction of a second; a
  -- lease that ran out anyway only has the sweep republish the finished record,
  -- whose copy re-stores the result row), and it left the deadlines set at the
  -- claim. Only a task finished without a claim (poison, expired before it ran)
  -- gets the settle lease and leaves the set here (docs/redis-budget.md).
  if not (st == 'running' and owner ~= '' and f[3] == owner) then
    redis.call('ZADD', c.leases, c.settle_until, record)
    if c.deadlines then waiting_remove(c.deadlines, record, c.lane_prefix, f[2]) end
  end
  if f[4] then lim_release(record, f[4]) end
  -- The hand-over (pop the head, publish the next) and a dispatch's append
  -- (admit.lua) are each one script, so they never interleave: a chat queue is
  -- deleted by Redis only when this pop empties it, and an append after that
  -- simply creates it again with the new message as head.
  -- The queue's first two ids in one read: whether this task is the head, and who follows (hand_over).
  local next_id = ''
  if chat ~= '' then
    local head = redis.call('LRANGE', chat_queue, 0, 1)
    if head[1] == task_id then
      next_id = hand_over(chat_queue, chat, chat_records, c.chats, c.leases, c.handover_until, c.chat_waiting_prefix,
        head)
    end
  end
  return 'ok', next_id
end

-- Finish the succeeded items named in ARGV from ``first`` on (FINISH_ITEM_FIELDS each: task_id, record,
-- chat id or '', result JSON, owner, tombstone: '1' to write one, '' when its type keeps a result row:
-- lanes.lua.finish_batch.DoneItem), each as finish.lua finishes one task: finish_batch.lua's whole
-- call, claim_group.lua's first part. ``p`` names what they share: the keys (leases, deadlines, chats,
-- metrics_total, metrics_minute) and the call's terms (now, tomb_ttl_s, queued_lease_ms, settle_lease_ms,
-- chat_waiting_prefix, limit_prefix, lane_prefix, chat_prefix, tombstone_prefix). Returns finish_record's
-- reply per item.
local FINISH_ITEM_FIELDS = 6

local function finish_done_items(p, first)
  lim_setup(p.limit_prefix, p.lane_prefix, p.metrics_total, p.metrics_minute, p.now, p.leases,
    p.now + tonumber(p.queued_lease_ms))
  local c = {
    leases = p.leases, deadlines = p.deadlines, lane_prefix = p.lane_prefix, chats = p.chats,
    tomb_ttl_s = tonumber(p.tomb_ttl_s), settle_until = p.now + tonumber(p.settle_lease_ms),
    handover_until = p.now + tonumber(p.queued_lease_ms), chat_waiting_prefix = p.chat_waiting_prefix,
  }
  local replies = {}
  for i = first, #ARGV, FINISH_ITEM_FIELDS do
    local task_id, record, chat, result, owner, tomb = unpack(ARGV, i, i + FINISH_ITEM_FIELDS - 1)
    local chat_base = chat_tag(p.chat_prefix, chat)
    replies[#replies + 1] = finish_record(c, record, task_id, 'done', result, owner,
      tomb ~= '' and p.tombstone_prefix .. task_id or nil, chat, chat_base .. CHAT_QUEUE_SUFFIX,
      chat_base .. CHAT_RECORDS_SUFFIX)
  end
  return replies
end

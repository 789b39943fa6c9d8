-- audit.lua: repair chats whose head can no longer move, and tasks whose copy a worker
-- lost unclaimed (self-healing backstop).
--
-- KEYS[1] active chats index (zset)   KEYS[2] leases   KEYS[3] audit cursor
-- KEYS[4] metrics totals   KEYS[5] metrics minute (a hand-over may gate the next head)
-- KEYS[6] deadlines of waiting tasks (a running head republished waits again)
-- KEYS[7] live processes (zset: host:pid -> liveness expiry ms)
-- KEYS[8] vouched processes (zset: host:pid -> until ms)
-- KEYS[9] where the walk of parked leases goes on from (an offset)
-- KEYS[10] where the walk of the waiting tasks (the deadlines set) goes on from (an offset)
-- ARGV: 1 now ms, 2 chats per call, 3 queued lease ms, 4 chat key prefix
--   ('dispatch:chat:'), 5 chat-waiting key prefix, 6 limits key prefix,
--   7 lane key prefix, 8 held-set key prefix, 9 how long a head may be held
--   (ms: attempt limit plus lease) by task type, as JSON, 10 the same for a type not named there,
--   11 parked leases looked at per call, and waiting tasks looked at per call
-- Returns {chats_checked, heads_handed_over, heads_republished, index_entries_dropped,
--   then per repair: lane, chat id ('' for a task of no chat), task id, cause}; causes: 'vanished' / 'cancelled'
--   (head record gone or cancelled: handed over), 'no_lease' (republished),
--   'lost_copy' (queued, its copy gone: republished), 'owner_dead' / 'owner_gone' /
--   'not_running' (running, its owner dead, unknown, or no longer holding it: republished).
--   Each repair counts 'chats_repaired|<lane>|<cause>' (dispatch_chats_repaired_total).
--
-- Normal operation never needs this: admit, finish and the lease sweep keep
-- every head moving. It covers what they cannot see: a head record that
-- vanished (a script aborted midway, or data lost to an fsync window), a head
-- without a lease (a head waiting on a limit has none, by design: it is left
-- alone; a head sent for later and not due goes back to its delayed set), and a
-- head held past its type's attempt limit plus the lease running for an owner
-- whose process is dead, unknown, or no longer holds it. Beside the chats it walks
-- the parked leases, a batch per call, for a task (a chat's head, or of no chat) held as long:
-- - queued, its lease parked by the sweep ('+inf': its copy was taken to wait in
--   its lane list, which held messages) while the copy is not there: a live
--   worker took it and lost it unclaimed (FAULTS.md, the stuck chat of scenarios
--   4 and 10: its claim met Redis away and the task was acked, or its pop's
--   reply was lost, the record left named in the live worker's in-hand set).
-- - queued and published with no lease at all, its lane list empty: its copy is gone and no pop took
--   it (admission writes no queued lease: the copy waits in the list, and the pop that takes it leases
--   it in the same call, pop_more.lua), so it is republished at once, as the sweep republished a
--   queued record whose lease ran out onto an empty list before admission stopped writing one. These
--   are found by a walk over the deadlines set (every waiting task), a batch per call, reading only.
-- The first pass that sees such a head notes it on the record ('aud': what it saw
-- and when); a later pass repairs it if nothing moved since. A republished head
-- stays the head (chat order kept); an old copy, if one survives, meets its claim
-- (start.lua) and never runs twice. A task of no chat republished is not counted as
-- a chat repaired in the reply's counts, only in its repairs. It walks the index
-- with ZSCAN, a batch per call.

local chats, leases, cursor_key, metrics_total, metrics_minute, deadlines, procs, vouched, parked_cursor =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local waiting_cursor = KEYS[10]
local now, batch, queued_lease_ms, chat_prefix, chat_waiting_prefix, limit_prefix, lane_prefix = tonumber(ARGV[1]),
  tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4], ARGV[5], ARGV[6], ARGV[7]
local held_prefix, held_json, held_default_ms, parked_batch = ARGV[8], ARGV[9], tonumber(ARGV[10]), tonumber(ARGV[11])

local cursor = redis.call('GET', cursor_key) or '0'
local scan = redis.call('ZSCAN', chats, cursor, 'COUNT', batch)
redis.call('SET', cursor_key, scan[1])
local lease_until = now + queued_lease_ms
lim_setup(limit_prefix, lane_prefix, metrics_total, metrics_minute, now, leases, lease_until)
local held_for = cjson.decode(held_json)
local held_default = held_default_ms
local checked, handed, republished, dropped = 0, 0, 0, 0
local repairs = {}

local function repaired(lane, chat_id, task_id, cause)
  lane = lane or ''
  repairs[#repairs + 1] = lane
  repairs[#repairs + 1] = chat_id
  repairs[#repairs + 1] = task_id
  repairs[#repairs + 1] = cause
  count_to(metrics_total, metrics_minute, 'chats_repaired|' .. lane .. '|' .. cause)
end

-- Whether a head in state ``st`` has been held too long by an owner that cannot move it:
-- its cause, or nil. ``seen`` is what the record's note must say for the head not to have moved.
local function stalled(record, st, lease, ttype)
  local f = redis.call('HMGET', record, 'own', 'dlv', 'pub', 'aud', 'msg', 'q')
  local seen, cause
  if st == 'queued' and lease == 'inf' and f[5] and f[6] then
    seen = 'q|' .. (f[3] or '')
  elseif st == 'running' and f[1] and f[1] ~= '' then
    seen = 'r|' .. f[1] .. '|' .. (f[2] or '')
  else
    return nil
  end
  local note_seen, note_at = string.match(f[4] or '', '^(.*)|(%d+)$')
  if note_seen ~= seen then
    redis.call('HSET', record, 'aud', seen .. '|' .. now)
    return nil
  end
  if now - tonumber(note_at) < (tonumber(held_for[ttype]) or held_default) then return nil end
  if st == 'queued' then
    -- Its copy, as publish_record wrote it, from the consuming end of its list.
    local copy = list_item(record, f[3])
    -- Not there: a worker took it, and a live one's in-hand set may still name it, but
    -- none holds it any more this long after its lease (a popped message waits in a
    -- worker's memory at most for one attempt to free its slot). A copy that does
    -- survive somewhere meets the claim of this one (start.lua) and never runs twice.
    if redis.call('LPOS', f[6], copy, 'RANK', -1, 'MAXLEN', 1000) then return nil end
    cause = 'lost_copy'
  else
    local proc = string.match(f[1], '^(.*):[^:]*$') or f[1]
    local alive = redis.call('ZSCORE', procs, proc)
    if not alive then
      cause = 'owner_gone'
    elseif tonumber(alive) <= now and tonumber(redis.call('ZSCORE', vouched, proc) or '0') <= now then
      cause = 'owner_dead'
    elseif redis.call('SISMEMBER', held_prefix .. proc, record) == 0 then
      cause = 'not_running'
    else
      return nil  -- alive and holding it: an overrun, which its own worker ends (attempt limits)
    end
  end
  return cause
end

local entries = scan[2]
for i = 1, #entries, 2 do
  local chat_id = entries[i]
  local tagged = chat_tag(chat_prefix, chat_id)
  local queue, records = tagged .. CHAT_QUEUE_SUFFIX, tagged .. CHAT_RECORDS_SUFFIX
  checked = checked + 1
  local head = redis.call('LINDEX', queue, 0)
  if not head then
    redis.call('ZREM', chats, chat_id)
    dropped = dropped + 1
  else
    local record = records .. head
    local r = redis.call('HMGET', record, 'st', 'lane', 'type', 'pub')
    local st, lane = r[1], r[2]
    local lease = redis.call('ZSCORE', leases, record)
    -- Published and waiting in its list: no lease by design (its copy is there; lost from an empty list,
    -- the waiting walk below republishes it). A head never published (pub 0) has lost its hand-over.
    local listed = st == 'queued' and (tonumber(r[4]) or 0) > 0
    if not st or st == 'cancelled' then
      -- Vanished, or cancelled while still the head (cancel.lua hands over in the same call,
      -- so only a script aborted midway leaves this; never republish it): the chat moves on.
      local next_id = hand_over(queue, chat_id, records, chats, leases, lease_until, chat_waiting_prefix)
      handed = handed + 1
      if not lane and next_id ~= '' then lane = redis.call('HGET', records .. next_id, 'lane') end
      repaired(lane, chat_id, head, st and 'cancelled' or 'vanished')
    elseif st ~= 'limited' and not lease and not listed then
      local f = redis.call('HMGET', record, 'eta', 'dq')
      if st == 'scheduled' and tonumber(f[1]) > now then
        -- Sent for later and not due: back to its delayed set, never published early.
        redis.call('ZADD', f[2], tonumber(f[1]), record)
        redis.call('ZADD', leases, tonumber(f[1]) + queued_lease_ms, record)
      else
        publish_record(record, leases, lease_until)
      end
      republished = republished + 1
      repaired(lane, chat_id, head, 'no_lease')
    elseif st == 'running' then
      local cause = stalled(record, st, lease, r[3] or '')
      if cause then
        local deadline = redis.call('HGET', record, 'dl')
        publish_record(record, leases, lease_until)
        -- A claim had taken it out of the deadlines set: it waits again (as sweep.lua does).
        if deadline then waiting_add(deadlines, record, tonumber(deadline), lane_prefix, lane) end
        redis.call('HDEL', record, 'aud')
        republished = republished + 1
        repaired(lane, chat_id, head, cause)
      end
    end
  end
end

-- The parked leases, from where the last call stopped (the offset wraps at the end).
local want = parked_batch
local offset = tonumber(redis.call('GET', parked_cursor) or '0')
local parked = redis.call('ZRANGEBYSCORE', leases, '+inf', '+inf', 'LIMIT', offset, want)
redis.call('SET', parked_cursor, #parked < want and 0 or offset + #parked)
for _, record in ipairs(parked) do
  local r = redis.call('HMGET', record, 'st', 'lane', 'type', 'chat')
  if r[1] == 'queued' and stalled(record, 'queued', 'inf', r[3] or '') then
    publish_record(record, leases, lease_until)
    redis.call('HDEL', record, 'aud')
    if r[4] and r[4] ~= '' then republished = republished + 1 end
    repaired(r[2], r[4] or '', string.match(record, '([^:]+)$'), 'lost_copy')
  end
end
-- The waiting tasks, from where the last call stopped (the offset wraps at the end): a published
-- 'queued' record with no lease whose lane list is empty lost its copy (header). Each list's length
-- is read once a call, before any republish here refills it.
local w_offset = tonumber(redis.call('GET', waiting_cursor) or '0')
local waiting = redis.call('ZRANGE', deadlines, w_offset, w_offset + want - 1)
redis.call('SET', waiting_cursor, #waiting < want and 0 or w_offset + #waiting)
if #waiting > 0 then
  local scores = redis.call('ZMSCORE', leases, unpack(waiting))
  local lengths = {}
  for i, record in ipairs(waiting) do
    if not scores[i] then
      local r = redis.call('HMGET', record, 'st', 'pub', 'q', 'lane', 'chat')
      if r[1] == 'queued' and (tonumber(r[2]) or 0) > 0 and r[3] then
        if lengths[r[3]] == nil then lengths[r[3]] = redis.call('LLEN', r[3]) end
        if lengths[r[3]] == 0 then
          publish_record(record, leases, lease_until)
          if r[5] and r[5] ~= '' then republished = republished + 1 end
          repaired(r[4], r[5] or '', string.match(record, '([^:]+)$'), 'lost_copy')
        end
      end
    end
  end
end

local out = {checked, handed, republished, dropped}
for _, v in ipairs(repairs) do out[#out + 1] = v end
return out

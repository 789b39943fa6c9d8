-- claim_batch.lua: take up to N more ready tasks of one batched type from its
-- lane's broker lists and claim each, in one call (docs/batching.md).
--
-- KEYS[1] leases   KEYS[2] deadlines of waiting tasks   KEYS[3] live processes (zset)
-- KEYS[4] the claiming process's held set   KEYS[5..] the lane's lists, in
--   the order kombu pops them (kombu priority 0 first)
-- ARGV: 1 handler (the message's 'task' header), 2 task type (its 'shadow'
--   header), 3 owner (host:pid:thread), 4 now ms, 5 lease ms, 6 max deliveries,
--   7 most tasks to claim, 8 most messages to look at, 9 the claiming process
--   (host:pid), 10 liveness ms (a process claiming before its first beat
--   registers with it; 0 once it has beaten), 11 chat key prefix
--   ('dispatch:chat:'), 12 lane key prefix (each claimed task leaves its lane's
--   waiting count with the deadlines set, _lib.lua)
-- Returns {stored message, record, delivery tag, ...} per task claimed (the lane lists
-- name records: _lib.lua's list_item). Their counts (started) are the wrapper's, kept
-- in process (lanes.counters), which writes each out as the message a pop delivers.
--
-- A message is taken only when the single path's claim (start.lua) would run it
-- at once: its record is 'queued' at the copy's publish, it is its chat's
-- head, and it has deliveries left. Anything else (a stale copy, a finished
-- task to re-store, a poison, a busy claim) stays in its list for the single
-- path, which knows what to do with it. Each taken message leaves the list and
-- enters the process's held set in this same call (the set, the leases and the
-- deadlines set are written once for all of them at the end), so there is no moment at
-- which a claimed task is in neither (docs/liveness.md): a worker killed after
-- this call has each item reclaimed by reclaim.lua like any running claim.
--
-- Limits: a message is in a lane list only once its limits admitted it (a
-- limited task waits in Redis with no message out, and holds its slot from its
-- publish to its finish), so taking more messages never takes more than the
-- limits admit. Chat order: only a chat's head is ever published, so two
-- items of one chat are never in one batch, nor in two batches at once.

local leases, deadlines, procs, held = unpack(KEYS, 1, 4)
local lists = {unpack(KEYS, 5)}
local handler, task_type, owner, now_ms, lease_ms, max_deliveries, most, look_at_most, process, liveness_ms,
  chat_prefix, lane_prefix = unpack(ARGV, 1, 12)

local want = tonumber(most)
local budget = tonumber(look_at_most)
local now = tonumber(now_ms)
local lease_until = now + tonumber(lease_ms)
local max_dlv = tonumber(max_deliveries)
local taken = {}
local claimed, leased, by_lane = {}, {}, {}
local looked = 0

for _, list in ipairs(lists) do
  if #claimed >= want or looked >= budget then break end
  -- kombu pops from the right (oldest first): look at the oldest messages first.
  local window = budget - looked
  local msgs = redis.call('LRANGE', list, -window, -1)
  -- Taken messages that are the list's oldest, one after the other, leave it by one LTRIM;
  -- one taken after a message left in place leaves by its own LREM, after the LTRIM.
  local trim, removals, unbroken = 0, {}, true
  for j = #msgs, 1, -1 do
    if #claimed >= want then break end
    looked = looked + 1
    local raw = msgs[j]
    local took = false
    -- A record's reference (_lib.lua's list_item); a whole message (pushed back by a worker) is
    -- left for the single path.
    local record, pub = list_item_parts(raw)
    local f = record and redis.call('HMGET', record, 'st', 'pub', 'chat', 'dlv', 'lane', 'type', 'msg') or {}
    local head = f[7] and string.match(f[7], '^([^\n]*)\n')
    local ok, h = false, nil
    if head and f[6] == task_type then ok, h = pcall(cjson.decode, head) end
    if ok and type(h) == 'table' and h[1] == handler then
      local task_id = string.match(record, '([^:]+)$')
      local dlv = tonumber(f[4] or '0')
      local ready = f[1] == 'queued' and f[2] == pub and dlv < max_dlv
      if ready and f[3] and f[3] ~= '' then
        ready = redis.call('LINDEX', chat_tag(chat_prefix, f[3]) .. CHAT_QUEUE_SUFFIX, 0) == task_id
      end
      if ready then
        took = true
        if unbroken then trim = trim + 1 else removals[#removals + 1] = raw end
        -- The delivery count travels in the claim's HSET (as start.lua's).
        redis.call('HSET', record, 'st', 'running', 'own', owner, 'dlv', dlv + 1)
        taken[#taken + 1] = f[7]
        taken[#taken + 1] = record
        taken[#taken + 1] = task_id .. '.' .. pub
        claimed[#claimed + 1] = record
        leased[#leased + 1] = lease_until
        leased[#leased + 1] = record
        local lane = f[5] or ''
        by_lane[lane] = by_lane[lane] or {}
        table.insert(by_lane[lane], record)
      end
    end
    if not took then unbroken = false end
  end
  if trim > 0 then redis.call('LTRIM', list, 0, -(trim + 1)) end
  for _, raw in ipairs(removals) do redis.call('LREM', list, -1, raw) end
end

if #taken > 0 then
  -- Every claimed record at once: out of the deadlines set and its lane's
  -- waiting count, a lease each, and into the process's held set.
  for lane, records in pairs(by_lane) do waiting_remove_all(deadlines, records, lane_prefix, lane) end
  redis.call('ZADD', leases, unpack(leased))
  redis.call('SADD', held, unpack(claimed))
  -- A process that has not beaten yet registers with its claims (0: it has, its beat keeps it).
  if tonumber(liveness_ms) > 0 then redis.call('ZADD', procs, 'NX', now + tonumber(liveness_ms), process) end
end
return taken

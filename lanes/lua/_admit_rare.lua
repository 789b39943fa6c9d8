-- _admit_rare.lua: what admission runs only off the plain path (a chunk of many's deferred writes, a
-- refusal, a debounce's replacement, a limit's gate), made only by a call that needs it: admit.lua's
-- ``--! lazy _admit_rare.lua as admit_rare`` (lanes/lua/loader.py), so ``admit_rare().fn(...)``. Lua makes a
-- script's every ``local function`` again at each call; these, and the ``_lib.lua`` blocks only they use
-- (the limits', cancel_record's), are most of what a plain item's call made and never ran
-- (docs/redis-budget.md, "The plain item's call in Redis").
--! include _cancel.lua

local function pend_new()
  return {add = 0, base = nil, deadlines = {}, leases = {}, lists = {}, order = {}, callers = {}, owned = {}}
end

-- ``command key`` with the members of ``args``, in runs that fit Lua's stack (unpack); the last run's reply.
local function call_in_runs(command, key, args)
  local run, reply = 2000, nil
  for i = 1, #args, run do
    reply = redis.call(command, key, unpack(args, i, math.min(i + run - 1, #args)))
  end
  return reply
end

local function pend_flush(pend, waiting_key, deadlines_key, leases_key)
  if pend.add ~= 0 then
    if tonumber(redis.call('INCRBY', waiting_key, pend.add)) < 0 then redis.call('DEL', waiting_key) end
  end
  for caller, n in pairs(pend.callers) do caller_move(pend.lane_prefix, pend.lane, caller, n) end
  call_in_runs('ZADD', deadlines_key, pend.deadlines)
  call_in_runs('ZADD', leases_key, pend.leases)
  -- One ring per lane doorbell for every list the call pushed to that was empty (a chunk is one
  -- lane's): a list that held messages was rung for them already (rings_for, _lib.lua).
  local bells = {}
  for _, list in ipairs(pend.order) do
    local pushed = pend.lists[list]
    if rings_for(call_in_runs('LPUSH', list, pushed), #pushed) then
      local bell = bell_of(list)
      bells[bell] = bit.bor(bells[bell] or 0, bell_bit(list))
    end
  end
  for bell, bits in pairs(bells) do ring(bell, bits) end
  -- Reset in place (admit_one holds this table); base too, which pairs() of a fresh table would skip
  -- (nil): the next deferred item reads the waiting count again, with what was just written.
  pend.add, pend.base, pend.deadlines, pend.leases, pend.lists, pend.order = 0, nil, {}, {}, {}, {}
  pend.callers, pend.owned = {}, {}
end

-- A count in the metrics hashes for the task type's lane and type.
local function admit_count(c, kind, extra)
  count_to(c.metrics_total, c.metrics_minute, kind .. '|' .. c.lane .. '|' .. c.task_type .. (extra or ''))
end

-- A refusal after the task was counted in the lane's depth: count it out again.
local function admit_reject(c, pend, waiting_key, depth, reason)
  if pend then
    pend.add = pend.add - 1
  elseif tonumber(redis.call('DECR', waiting_key)) < 0 then
    redis.call('DEL', waiting_key)
  end
  admit_count(c, 'rejected', '|' .. reason)
  return 'rej', reason, depth
end

-- The debounced task ``id`` (its ``record``) replaced by ``by``, cancelled as cancel.lua cancels:
-- its id and chat when it was (the caller stores its REVOKED row), else nil.
local function replace_held(c, record, id, by)
  local now = tonumber(c.now_ms)
  local lease_until = now + tonumber(c.queued_lease_ms)
  lim_setup(c.limit_prefix, c.lane_prefix, c.metrics_total, c.metrics_minute, now, c.leases, lease_until)
  local detail = 'replaced by ' .. by
  local p = {now = now, detail_json = cjson.encode(detail), detail_text = detail, tombstone_prefix = TOMBSTONE_PREFIX,
    tombstone_ttl_s = tonumber(c.tombstone_ttl_s), settle_lease_ms = tonumber(c.settle_lease_ms),
    lease_until = lease_until,
    chat_prefix = CHAT_PREFIX, chat_waiting_prefix = CHAT_WAITING_PREFIX, delayed_prefix = DELAYED_PREFIX,
    lane_prefix = c.lane_prefix, leases = c.leases, deadlines = c.deadlines, chats = c.chats,
    metrics_total = c.metrics_total, metrics_minute = c.metrics_minute, only_lane = '', waiting_only = true}
  local outcome, _, _, _, chat = cancel_record(p, record, id)
  if outcome ~= 'cancelled' then return nil, nil end
  return id, chat or ''
end

-- A limited item due now at its chat's head (or without a chat): through its limits' gate (_lib.lua).
local function admit_gate(c, record, it)
  local now = tonumber(c.now_ms)
  lim_setup(c.limit_prefix, c.lane_prefix, c.metrics_total, c.metrics_minute, now, c.leases,
    now + tonumber(c.queued_lease_ms))
  gate_publish(record, it.limits, c.lane, it.kombu_priority)
end

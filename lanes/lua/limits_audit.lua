-- limits_audit.lua: give back slots held by tasks that no longer run (a batch).
--
-- KEYS: definitions (hash), cursors (hash: limit name -> ZSCAN cursor), leases, metrics_total,
--   metrics_minute
-- ARGV: now_ms, batch (instances per limit per call), queued_lease_ms, limit_prefix, lane_prefix,
--   per_instance (most holders checked per instance)
-- Returns {instances_checked, slots_freed}.
--
-- Normal operation never needs this: finish, retry and expire give every slot
-- back, and a dead worker's task keeps its slot while the sweep republishes it.
-- It covers what they cannot see: a holder whose record vanished, or is no
-- longer published or running (a script aborted midway, data lost to an fsync
-- window). Each instance checked is also drained, so a waiting head whose
-- wake-up was lost moves on.

local definitions, cursors, leases, metrics_total, metrics_minute = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local now, batch, queued_lease_ms, prefix, lane_prefix, per =
  tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4], ARGV[5], tonumber(ARGV[6])

lim_setup(prefix, lane_prefix, metrics_total, metrics_minute, now, leases, now + queued_lease_ms)
local checked, freed = 0, 0

local function holds(record)
  local st = redis.call('HGET', record, 'st')
  return st == 'queued' or st == 'running'
end

for _, name in ipairs(redis.call('HKEYS', definitions)) do
  local index = prefix .. LIMIT_INSTANCES_INFIX .. name
  local scan = redis.call('ZSCAN', index, redis.call('HGET', cursors, name) or '0', 'COUNT', batch)
  if scan[1] == '0' then redis.call('HDEL', cursors, name) else redis.call('HSET', cursors, name, scan[1]) end
  local wide = prefix .. name .. ':' .. LIMIT_HOLDING_SUFFIX
  for _, record in ipairs(redis.call('SRANDMEMBER', wide, per)) do
    if not holds(record) then
      redis.call('SREM', wide, record)
      freed = freed + 1
    end
  end
  local entries = scan[2]
  for i = 1, #entries, 2 do
    local base = entries[i]
    checked = checked + 1
    local holding = base .. LIMIT_HOLDING_SUFFIX
    for _, record in ipairs(redis.call('SRANDMEMBER', holding, per)) do
      if not holds(record) then
        redis.call('SREM', holding, record)
        freed = freed + 1
      end
    end
    -- The index counts waiting + holding: set it right, or drop an idle instance.
    local busy = redis.call('SCARD', holding) + redis.call('ZCARD', base .. LIMIT_WAITING_SUFFIX)
    if busy == 0 then redis.call('ZREM', index, base) else redis.call('ZADD', index, busy, base) end
    if busy > 0 then lim_drain(base, 20) end
  end
end
return {checked, freed}

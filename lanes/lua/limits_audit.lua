-- limits_audit.lua: give back slots held by tasks that no longer run (a batch).
--
-- KEYS[1] definitions (hash)   KEYS[2] audit cursors (hash: limit name -> ZSCAN cursor)
-- KEYS[3] leases   KEYS[4] metrics totals   KEYS[5] metrics minute
-- ARGV: 1 now ms, 2 instances per limit per call, 3 queued lease ms, 4 limits key
--   prefix, 5 lane key prefix, 6 most holders checked per instance
-- Returns {instances_checked, slots_freed}.
--
-- Normal operation never needs this: finish, retry and expire give every slot
-- back, and a dead worker's task keeps its slot while the sweep republishes it.
-- It covers what they cannot see: a holder whose record vanished, or is no
-- longer published or running (a script aborted midway, data lost to an fsync
-- window). Each instance checked is also drained, so a waiting head whose
-- wake-up was lost moves on.

local now = tonumber(ARGV[1])
local prefix = ARGV[4]
lim_setup(prefix, ARGV[5], KEYS[4], KEYS[5], now, KEYS[3], now + tonumber(ARGV[3]))
local checked, freed = 0, 0
local per = tonumber(ARGV[6])

local function holds(record)
  local st = redis.call('HGET', record, 'st')
  return st == 'queued' or st == 'running'
end

for _, name in ipairs(redis.call('HKEYS', KEYS[1])) do
  local index = prefix .. 'inst:' .. name
  local scan = redis.call('ZSCAN', index, redis.call('HGET', KEYS[2], name) or '0', 'COUNT', tonumber(ARGV[2]))
  if scan[1] == '0' then redis.call('HDEL', KEYS[2], name) else redis.call('HSET', KEYS[2], name, scan[1]) end
  local wide = prefix .. name .. '::f'
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
    for _, record in ipairs(redis.call('SRANDMEMBER', base .. ':f', per)) do
      if not holds(record) then
        redis.call('SREM', base .. ':f', record)
        freed = freed + 1
      end
    end
    -- The index counts waiting + holding: set it right, or drop an idle instance.
    local busy = redis.call('SCARD', base .. ':f') + redis.call('ZCARD', base .. ':w')
    if busy == 0 then redis.call('ZREM', index, base) else redis.call('ZADD', index, busy, base) end
    if busy > 0 then lim_drain(base, 20) end
  end
end
return {checked, freed}

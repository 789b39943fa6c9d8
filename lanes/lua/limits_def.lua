-- limits_def.lua: publish the limits' definitions where the gate reads them.
--
-- KEYS: definitions (hash: name -> JSON), due (instances, zset)
-- ARGV: now_ms, limit_prefix, then pairs from PAIRS on: name, JSON, name, JSON, ...
-- Returns the number of limits added, changed or removed.
--
-- Idempotent, so every process's config cache may run it on each reload. A
-- limit that changed or went away has its busy instances (up to 1000) made due
-- now: the next promote pass drains them under the new definition, so an edit
-- (a higher max_in_flight, a removed limit) frees waiting tasks within seconds.

local definitions, due = KEYS[1], KEYS[2]
local now, prefix, PAIRS, pairs_in = tonumber(ARGV[1]), ARGV[2], 3, ARGV

local old = {}
local flat = redis.call('HGETALL', definitions)
for i = 1, #flat, 2 do old[flat[i]] = flat[i + 1] end
local changed = {}
local seen = {}
for i = PAIRS, #pairs_in, 2 do
  local name, def = pairs_in[i], pairs_in[i + 1]
  seen[name] = true
  if old[name] ~= def then
    redis.call('HSET', definitions, name, def)
    changed[#changed + 1] = name
  end
end
for name, _ in pairs(old) do
  if not seen[name] then
    redis.call('HDEL', definitions, name)
    changed[#changed + 1] = name
  end
end
for _, name in ipairs(changed) do
  for _, base in ipairs(redis.call('ZRANGE', prefix .. LIMIT_INSTANCES_INFIX .. name, 0, 999)) do
    redis.call('ZADD', due, 'LT', now, base)
  end
  if old[name] and not seen[name] then
    -- A removed fair share: its heads are freed by the drain above, per key.
    redis.call('DEL', prefix .. LIMIT_RING_INFIX .. name, prefix .. LIMIT_CREDIT_INFIX .. name)
  end
end
return #changed

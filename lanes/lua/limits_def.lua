-- limits_def.lua: publish the limits' definitions where the gate reads them.
--
-- KEYS[1] definitions (hash: name -> JSON)   KEYS[2] due instances (zset)
-- ARGV: 1 now ms, 2 limits key prefix, then pairs: 3 name, 4 JSON, 5 name, 6 JSON, ...
-- Returns the number of limits added, changed or removed.
--
-- Idempotent, so every process's config cache may run it on each reload. A
-- limit that changed or went away has its busy instances (up to 1000) made due
-- now: the next promote pass drains them under the new definition, so an edit
-- (a higher max_in_flight, a removed limit) frees waiting tasks within seconds.

local now = tonumber(ARGV[1])
local prefix = ARGV[2]
local old = {}
local flat = redis.call('HGETALL', KEYS[1])
for i = 1, #flat, 2 do old[flat[i]] = flat[i + 1] end
local changed = {}
local seen = {}
for i = 3, #ARGV, 2 do
  local name, def = ARGV[i], ARGV[i + 1]
  seen[name] = true
  if old[name] ~= def then
    redis.call('HSET', KEYS[1], name, def)
    changed[#changed + 1] = name
  end
end
for name, _ in pairs(old) do
  if not seen[name] then
    redis.call('HDEL', KEYS[1], name)
    changed[#changed + 1] = name
  end
end
for _, name in ipairs(changed) do
  for _, base in ipairs(redis.call('ZRANGE', prefix .. 'inst:' .. name, 0, 999)) do
    redis.call('ZADD', KEYS[2], 'LT', now, base)
  end
  if old[name] and not seen[name] then
    -- A removed fair share: its heads are freed by the drain above, per key.
    redis.call('DEL', prefix .. 'ring:' .. name, prefix .. 'credit:' .. name)
  end
end
return #changed

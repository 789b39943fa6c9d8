-- callers_audit.lua: recount the lanes' waiting counts, the tokens' ones too, when one was lost.
--
-- KEYS: deadlines (zset of waiting tasks)
-- ARGV: lane_prefix (lanes.keys.LANE_PREFIX), force ('1': recount whatever the check finds),
--   then the lanes to check (names).
-- Returns {recounted (0/1), then per count it corrected: lane, token id ('' for the lane's own
--   count), what it said, what it says now}.
--
-- Normal operation never needs this: waiting_add / waiting_remove (_lib.lua) move each lane's
-- count and its tokens' counts (``<lane>:callers``) with the deadlines set. It covers a count
-- lost (a key flushed or evicted, a script aborted midway): a tokens' hash without the field
-- LANE_CALLERS_COUNTED (this recount leaves it; nothing else writes or removes it), or whose
-- tokens hold more than the lane's count. Checking costs an HGETALL and a GET a lane; the
-- recount walks every waiting task once (ZRANGE, an HGET a record), in this one atomic call,
-- so no admission or claim can slip between the walk and the counts it writes.

local deadlines = KEYS[1]
local lane_prefix, force = ARGV[1], ARGV[2] == '1'
local lanes = {}
for i = 3, #ARGV do lanes[#lanes + 1] = ARGV[i] end

-- A lane's tokens' hash as a table (without its mark), and whether it has the mark.
local function callers_of(lane)
  local flat = redis.call('HGETALL', lane_prefix .. lane .. LANE_CALLERS_SUFFIX)
  local out, counted = {}, false
  for i = 1, #flat, 2 do
    if flat[i] == LANE_CALLERS_COUNTED then counted = true else out[flat[i]] = tonumber(flat[i + 1]) end
  end
  return out, counted
end

local wanted = force
if not wanted then
  for _, lane in ipairs(lanes) do
    local held, counted = callers_of(lane)
    local sum = 0
    for _, n in pairs(held) do sum = sum + n end
    if not counted or sum > tonumber(redis.call('GET', lane_prefix .. lane .. LANE_WAITING_SUFFIX) or '0') then
      wanted = true
      break
    end
  end
end
if not wanted then return {0} end

-- The truth: every waiting task, by its record's lane and, for a token's, its token.
local waiting, callers = {}, {}
for _, lane in ipairs(lanes) do
  waiting[lane], callers[lane] = 0, {}
end
for _, record in ipairs(redis.call('ZRANGE', deadlines, 0, -1)) do
  local lane = redis.call('HGET', record, 'lane')
  if lane then
    if not waiting[lane] then
      waiting[lane], callers[lane] = 0, {}
      lanes[#lanes + 1] = lane
    end
    waiting[lane] = waiting[lane] + 1
    local caller = caller_of(record)
    if caller then callers[lane][caller] = (callers[lane][caller] or 0) + 1 end
  end
end

local out = {1}
local function corrected(lane, caller, was, now)
  out[#out + 1] = lane
  out[#out + 1] = caller
  out[#out + 1] = was
  out[#out + 1] = now
end
for _, lane in ipairs(lanes) do
  local count_key = lane_prefix .. lane .. LANE_WAITING_SUFFIX
  local was = tonumber(redis.call('GET', count_key) or '0')
  if was ~= waiting[lane] then
    corrected(lane, '', was, waiting[lane])
    if waiting[lane] > 0 then redis.call('SET', count_key, waiting[lane]) else redis.call('DEL', count_key) end
  end
  local held = callers_of(lane)
  for caller, n in pairs(callers[lane]) do
    if held[caller] ~= n then corrected(lane, caller, held[caller] or 0, n) end
  end
  for caller, n in pairs(held) do
    if not callers[lane][caller] then corrected(lane, caller, n, 0) end
  end
  local key = lane_prefix .. lane .. LANE_CALLERS_SUFFIX
  redis.call('DEL', key)
  local fields = {LANE_CALLERS_COUNTED, '1'}
  for caller, n in pairs(callers[lane]) do
    fields[#fields + 1] = caller
    fields[#fields + 1] = n
  end
  redis.call('HSET', key, unpack(fields))
end
return out

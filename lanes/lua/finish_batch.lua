-- finish_batch.lua: the succeeded items of one batch reached 'done', in one call;
-- each item exactly as finish.lua finishes one task (docs/batching.md).
--
-- KEYS[1] leases   KEYS[2] active chats index   KEYS[3] metrics totals
-- KEYS[4] metrics minute   KEYS[5] deadlines of waiting tasks
-- ARGV: 1 now ms, 2 seconds to keep a tombstone, 3 queued lease ms,
--   4 settle lease ms, 5 metric field suffix ('lane|type'), 6 chat-waiting key
--   prefix, 7 limits key prefix, 8 lane key prefix, 9 chat key prefix
--   ('dispatch:chat:'), 10 tombstone key prefix, 11 execution-latency
--   observations and handler seconds, as JSON {"buckets": {label: count},
--   "sum": seconds, "busy": seconds}, 12 the same for queue latency (items whose
--   claim did not observe it), 13.. five per item: task id, record, chat id or
--   '', result JSON, owner that claimed it
-- Returns one reply per item, in order: 'ok' | 'already' | 'gone' | 'taken'
--   (what finish.lua answers; an item answered 'taken' stores no result row).
--
-- Like finish.lua it is safe to run twice: a second run finds each record
-- already done and changes nothing.

local now = tonumber(ARGV[1])
local field = ARGV[5]
local replies = {}
local done = 0
local lanes = {}
lim_setup(ARGV[7], ARGV[8], KEYS[3], KEYS[4], now, KEYS[1], now + tonumber(ARGV[3]))

for i = 13, #ARGV, 5 do
  local task_id, record, chat, result, owner = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4]
  local f = redis.call('HMGET', record, 'st', 'lane', 'own', 'lim')
  local st = f[1]
  if not st then
    replies[#replies + 1] = 'gone'
  elseif st == 'done' or st == 'dead' then
    replies[#replies + 1] = 'already'
  elseif st == 'running' and f[3] ~= owner then
    replies[#replies + 1] = 'taken'
  else
    redis.call('HSET', record, 'st', 'done', 'res', result, 'own', '')
    redis.call('SET', ARGV[10] .. task_id, 'done|' .. result, 'EX', tonumber(ARGV[2]))
    redis.call('ZADD', KEYS[1], now + tonumber(ARGV[4]), record)
    redis.call('ZREM', KEYS[5], record)
    done = done + 1
    lanes[f[2]] = (lanes[f[2]] or 0) + 1
    if f[4] then lim_release(record, f[4]) end
    if chat ~= '' then
      local queue = ARGV[9] .. '{' .. chat .. '}:q'
      if redis.call('LINDEX', queue, 0) == task_id then
        hand_over(queue, chat, ARGV[9] .. '{' .. chat .. '}:t:', KEYS[2], KEYS[1], now + tonumber(ARGV[3]), ARGV[6])
      end
    end
    replies[#replies + 1] = 'ok'
  end
end

-- Metrics: the same fields finish.lua and start.lua count, added once per batch.
local function add(key_field, n, float)
  if float then
    redis.call('HINCRBYFLOAT', KEYS[3], key_field, n)
    return
  end
  redis.call('HINCRBY', KEYS[3], key_field, n)
  if redis.call('HINCRBY', KEYS[4], key_field, n) == n and redis.call('TTL', KEYS[4]) < 0 then
    redis.call('EXPIRE', KEYS[4], 1200)
  end
end
if done > 0 then
  add('succeeded|' .. field, done)
  for lane, n in pairs(lanes) do add('completed|' .. lane, n) end
  local xlat = cjson.decode(ARGV[11])
  for label, n in pairs(xlat['buckets']) do add('xlat|' .. field .. '|' .. label, n) end
  if xlat['sum'] > 0 then add('xlat_sum|' .. field, xlat['sum'], true) end
  if xlat['busy'] > 0 then
    for lane, _ in pairs(lanes) do redis.call('HINCRBYFLOAT', KEYS[4], 'busy|' .. lane, xlat['busy']) end
  end
end
local qlat = cjson.decode(ARGV[12])
for label, n in pairs(qlat['buckets']) do add('qlat|' .. field .. '|' .. label, n) end
if qlat['sum'] > 0 then add('qlat_sum|' .. field, qlat['sum'], true) end
return replies

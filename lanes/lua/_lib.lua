-- _lib.lua: helpers prepended to every script by lanes.lua.loader (not run alone).
--
-- A task record is a hash: msg (the broker message, a NUL byte where the
-- delivery tag goes), q (the lane list it is published to), lane, type,
-- st (queued|running|retry|done|dead), att (attempt), dlv (deliveries of this
-- attempt), own (worker running it), chat (chat id or ''), pub (publish count),
-- res (outcome detail, once done or dead: kept until the worker stored the
-- result row and settled the record with forget.lua).

-- Publish a record's message to its lane list with a fresh delivery tag, and
-- give it a lease after which the recovery sweep republishes it. ``state`` is
-- the record's state from now on (default 'queued'; a finished record whose
-- result row may be missing keeps 'done'/'dead', so its copy only re-stores it).
local function publish_record(record, leases_key, lease_until, state)
  local f = redis.call('HMGET', record, 'msg', 'q')
  if not f[1] then return false end
  local msg = f[1]
  local mark = string.find(msg, '\0', 1, true)
  local pub = redis.call('HINCRBY', record, 'pub', 1)
  local task_id = string.match(record, '([^:]+)$')
  redis.call('LPUSH', f[2], string.sub(msg, 1, mark - 1) .. task_id .. '.' .. pub .. string.sub(msg, mark + 1))
  redis.call('HSET', record, 'st', state or 'queued', 'own', '')
  redis.call('ZADD', leases_key, lease_until, record)
  return true
end

-- Is the record's latest published copy still in the broker: waiting in its
-- lane list (searched from the consuming end, at most ``window`` entries), or
-- reserved by a worker in kombu's unacked hash (messages published before
-- platform messages were marked as leased)? Returns nil when it cannot tell (a
-- longer list). A copy a worker holds, or one restored to the list (it was
-- re-serialised), is not recognised: it is republished, a harmless extra copy
-- (execution claims drop it).
local function still_in_broker(record, unacked_key, window)
  local f = redis.call('HMGET', record, 'msg', 'q', 'pub')
  if not f[1] then return false end
  local tag = string.match(record, '([^:]+)$') .. '.' .. (f[3] or '0')
  if redis.call('HEXISTS', unacked_key, tag) == 1 then return true end
  local mark = string.find(f[1], '\0', 1, true)
  local copy = string.sub(f[1], 1, mark - 1) .. tag .. string.sub(f[1], mark + 1)
  if redis.call('LPOS', f[2], copy, 'RANK', -1, 'MAXLEN', window) then return true end
  if redis.call('LLEN', f[2]) > window then return nil end
  return false
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

-- Hand a chat on after its head reached a terminal state: pop the head, and
-- publish the next message if there is one. Returns the next task id or ''.
local function hand_over(chat_queue, chat_id, record_prefix, chats_index, leases_key, lease_until,
                         chat_waiting_prefix)
  redis.call('LPOP', chat_queue)
  if tonumber(redis.call('ZINCRBY', chats_index, -1, chat_id)) <= 0 then
    redis.call('ZREM', chats_index, chat_id)
  end
  local next_id = redis.call('LINDEX', chat_queue, 0)
  if not next_id then return '' end
  local next_record = record_prefix .. next_id
  local next_lane = redis.call('HGET', next_record, 'lane')
  publish_record(next_record, leases_key, lease_until)
  if next_lane then
    local waiting = chat_waiting_prefix .. next_lane
    if tonumber(redis.call('DECR', waiting)) <= 0 then redis.call('DEL', waiting) end
  end
  return next_id
end

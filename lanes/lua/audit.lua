-- audit.lua: repair chats whose head can no longer move (self-healing backstop).
--
-- KEYS[1] active chats index (zset)   KEYS[2] leases   KEYS[3] audit cursor
-- ARGV: 1 now ms, 2 chats per call, 3 queued lease ms, 4 chat key prefix
--   ('dispatch:chat:'), 5 chat-waiting key prefix, 6 limits key prefix,
--   7 lane key prefix
-- KEYS[4] metrics totals   KEYS[5] metrics minute (a hand-over may gate the next head)
-- Returns {chats_checked, heads_handed_over, heads_republished, index_entries_dropped}
--
-- Normal operation never needs this: admit, finish and the lease sweep keep
-- every head moving. It covers what they cannot see: a head record that
-- vanished (a script aborted midway, or data lost to an fsync window) and a
-- head without a lease (a head waiting on a limit has none, by design: it is
-- left alone; a head sent for later and not due goes back to its delayed set). It walks the index with ZSCAN, a batch per call.

local cursor = redis.call('GET', KEYS[3]) or '0'
local scan = redis.call('ZSCAN', KEYS[1], cursor, 'COUNT', tonumber(ARGV[2]))
redis.call('SET', KEYS[3], scan[1])
local now = tonumber(ARGV[1])
local lease_until = now + tonumber(ARGV[3])
lim_setup(ARGV[6], ARGV[7], KEYS[4], KEYS[5], now, KEYS[2], lease_until)
local checked, handed, republished, dropped = 0, 0, 0, 0
local entries = scan[2]
for i = 1, #entries, 2 do
  local chat_id = entries[i]
  local base = ARGV[4] .. '{' .. chat_id .. '}:'
  local queue = base .. 'q'
  checked = checked + 1
  local head = redis.call('LINDEX', queue, 0)
  if not head then
    redis.call('ZREM', KEYS[1], chat_id)
    dropped = dropped + 1
  else
    local record = base .. 't:' .. head
    local st = redis.call('HGET', record, 'st')
    if not st or st == 'cancelled' then
      -- Vanished, or cancelled while still the head (cancel.lua hands over in the same call,
      -- so only a script aborted midway leaves this; never republish it): the chat moves on.
      hand_over(queue, chat_id, base .. 't:', KEYS[1], KEYS[2], lease_until, ARGV[5])
      handed = handed + 1
    elseif st ~= 'limited' and not redis.call('ZSCORE', KEYS[2], record) then
      local f = redis.call('HMGET', record, 'eta', 'dq')
      if st == 'scheduled' and tonumber(f[1]) > now then
        -- Sent for later and not due: back to its delayed set, never published early.
        redis.call('ZADD', f[2], tonumber(f[1]), record)
        redis.call('ZADD', KEYS[2], tonumber(f[1]) + tonumber(ARGV[3]), record)
      else
        publish_record(record, KEYS[2], lease_until)
      end
      republished = republished + 1
    end
  end
end
return {checked, handed, republished, dropped}

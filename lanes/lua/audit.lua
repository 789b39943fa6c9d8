-- audit.lua: repair chats whose head can no longer move (self-healing backstop).
--
-- KEYS: chats (the active chats index, zset), leases, cursor (the audit's), metrics_total,
--   metrics_minute (a hand-over may gate the next head)
-- ARGV: now_ms, batch (chats per call), queued_lease_ms, chat_prefix ('dispatch:chat:'),
--   chat_waiting_prefix, limit_prefix, lane_prefix
-- Returns {chats_checked, heads_handed_over, heads_republished, index_entries_dropped}
--
-- Normal operation never needs this: admit, finish and the lease sweep keep
-- every head moving. It covers what they cannot see: a head record that
-- vanished (a script aborted midway, or data lost to an fsync window) and a
-- head without a lease (a head waiting on a limit has none, by design: it is
-- left alone; a head sent for later and not due goes back to its delayed set). It walks the index with ZSCAN, a batch per call.

local chats, leases, cursor_key, metrics_total, metrics_minute = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local now, batch, queued_lease_ms, chat_prefix, chat_waiting_prefix, limit_prefix, lane_prefix =
  tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4], ARGV[5], ARGV[6], ARGV[7]

local cursor = redis.call('GET', cursor_key) or '0'
local scan = redis.call('ZSCAN', chats, cursor, 'COUNT', batch)
redis.call('SET', cursor_key, scan[1])
local lease_until = now + queued_lease_ms
lim_setup(limit_prefix, lane_prefix, metrics_total, metrics_minute, now, leases, lease_until)
local checked, handed, republished, dropped = 0, 0, 0, 0
local entries = scan[2]
for i = 1, #entries, 2 do
  local chat_id = entries[i]
  local tagged = chat_prefix .. '{' .. chat_id .. '}'
  local queue, records = tagged .. CHAT_QUEUE_SUFFIX, tagged .. CHAT_RECORDS_SUFFIX
  checked = checked + 1
  local head = redis.call('LINDEX', queue, 0)
  if not head then
    redis.call('ZREM', chats, chat_id)
    dropped = dropped + 1
  else
    local record = records .. head
    local st = redis.call('HGET', record, 'st')
    if not st or st == 'cancelled' then
      -- Vanished, or cancelled while still the head (cancel.lua hands over in the same call,
      -- so only a script aborted midway leaves this; never republish it): the chat moves on.
      hand_over(queue, chat_id, records, chats, leases, lease_until, chat_waiting_prefix)
      handed = handed + 1
    elseif st ~= 'limited' and not redis.call('ZSCORE', leases, record) then
      local f = redis.call('HMGET', record, 'eta', 'dq')
      if st == 'scheduled' and tonumber(f[1]) > now then
        -- Sent for later and not due: back to its delayed set, never published early.
        redis.call('ZADD', f[2], tonumber(f[1]), record)
        redis.call('ZADD', leases, tonumber(f[1]) + queued_lease_ms, record)
      else
        publish_record(record, leases, lease_until)
      end
      republished = republished + 1
    end
  end
end
return {checked, handed, republished, dropped}

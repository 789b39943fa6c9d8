-- _cancel.lua: cancel one task's record (cancel_record), included by cancel.lua (a cancel)
-- and admit.lua (a debounce replacing the task still waiting for its key).
--
-- ``p`` holds the caller's named values: now (ms), detail_json, detail_text, tombstone_prefix,
-- tombstone_ttl_s, settle_lease_ms, lease_until (a queued lease's end, ms), chat_prefix,
-- chat_waiting_prefix, delayed_prefix, lane_prefix, leases, deadlines, chats, metrics_total,
-- metrics_minute, only_lane ('' for any), waiting_only; lim_setup (_lib.lua) was called.
-- Returns outcome, detail, lane, type, chat (cancel.lua's header says what each outcome means).

local function cancel_record(p, record, task_id)
  local f = redis.call('HMGET', record, 'st', 'lane', 'type', 'chat', 'q', 'pub', 'msg', 'lim', 'lw', 'res')
  local st, lane, chat = f[1], f[2], f[4]
  if not st then
    local tomb = redis.call('GET', p.tombstone_prefix .. task_id)
    if not tomb then return 'unknown' end
    local outcome, rest = string.match(tomb, '^([^|]*)|(.*)$')
    if outcome == 'cancelled' then outcome = 'already' end
    return outcome or 'done', rest
  end
  if st == 'done' or st == 'dead' then return st, f[10] end
  if st == 'cancelled' then return 'already', f[10] end
  if p.only_lane ~= '' and lane ~= p.only_lane then return 'elsewhere' end
  if st == 'running' then
    if p.waiting_only then return 'skipped', 'running' end
    -- Told, not stopped: its handler reads ctx.cancelled; it is never retried (retry.lua).
    redis.call('HSETNX', record, 'cx', p.detail_text)
    return 'told'
  end
  if st ~= 'queued' and st ~= 'retry' and st ~= 'scheduled' and st ~= 'limited' then
    return 'skipped', 'state ' .. st
  end
  if st == 'limited' then
    if f[9] and redis.call('ZREM', f[9] .. LIMIT_WAITING_SUFFIX, record) == 1 then lim_count(f[9], -1) end
    lim_lane_waiting(lane, -1)
  elseif st == 'queued' and f[6] and f[6] ~= '0' then
    -- Its copy in the lane list (kombu pops from the tail: search from there).
    redis.call('LREM', f[5], -1, list_item(record, f[6]))
  end
  -- Scheduled or parked for a retry: it leaves the lane's delayed set (whatever its state says).
  redis.call('ZREM', p.delayed_prefix .. lane, record)
  redis.call('HSET', record, 'st', 'cancelled', 'res', p.detail_json, 'own', '')
  redis.call('HDEL', record, 'lw', 'ls')
  if st == 'queued' and f[8] then lim_release(record, f[8]) end
  if chat and chat ~= '' then
    local tagged = chat_tag(p.chat_prefix, chat)
    local queue = tagged .. CHAT_QUEUE_SUFFIX
    if redis.call('LINDEX', queue, 0) == task_id then
      hand_over(queue, chat, tagged .. CHAT_RECORDS_SUFFIX, p.chats, p.leases, p.lease_until, p.chat_waiting_prefix)
    elseif redis.call('LREM', queue, 1, task_id) > 0 then
      if tonumber(redis.call('ZINCRBY', p.chats, -1, chat)) <= 0 then redis.call('ZREM', p.chats, chat) end
      -- Behind its head (never published): counted as waiting behind its chat, whether
      -- queued or sent for later ('scheduled' waits in the chat queue until handed over).
      if (st == 'queued' or st == 'scheduled') and (f[6] or '0') == '0' then
        local waiting = p.chat_waiting_prefix .. lane
        if tonumber(redis.call('DECR', waiting)) <= 0 then redis.call('DEL', waiting) end
      end
    end
  end
  redis.call('SET', p.tombstone_prefix .. task_id, 'cancelled|' .. p.detail_json, 'EX', p.tombstone_ttl_s)
  -- It leaves the deadlines set, and its lane's waiting count with it (_lib.lua).
  waiting_remove(p.deadlines, record, p.lane_prefix, lane)
  redis.call('ZADD', p.leases, p.now + p.settle_lease_ms, record)
  count_to(p.metrics_total, p.metrics_minute, 'cancelled|' .. lane .. '|' .. (f[3] or ''))
  return 'cancelled', '', lane, f[3], chat
end


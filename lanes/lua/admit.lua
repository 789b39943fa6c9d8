-- admit.lua: admission of a chunk of one task type's dispatches, in one atomic step
-- (dispatch.delay sends a chunk of one, dispatch_many up to tasks.bulk.CHUNK_ITEMS);
-- each item is admitted by admit_one (_admit.lua), as if it were called alone.
--
-- KEYS, the chunk's (SHARED_KEYS of them, in this order):
--   config_version, leases (zset), chat_waiting (the lane's count of chat messages
--   waiting behind their head), delayed (the lane's delayed zset), metrics_total,
--   metrics_minute, metrics_previous_minute (hashes), chats (the active chats index),
--   deadlines (zset of waiting tasks), paused_lanes (set), consumers (the lane's live
--   consumers: worker -> heartbeat expiry ms, lanes.consumers), then the lane's ten
--   priority lists (kombu priority 0..9);
--   then each item's: its record, then its idempotency key and that key's old format
--   (read, never written, until keys stored before the upgrade have expired) when it
--   has a payload digest, then its chat's queue when it has a chat, then its dedupe key
--   (lanes.keys.dedupe: the task holding it) when it has one (a throttle or debounce).
-- ARGV, the chunk's (SHARED_ARGS of them, in this order):
--   version (expected config version), now_ms, lane, task_type, accepting '1'/'0',
--   capacity (of the lane), chat_queue_size, idempotency_window_s, queued_lease_ms,
--   replace_idempotency ('1': a requeue takes over the key; its task id is derived
--   from the dead letter, so a record of that id already here means an earlier
--   requeue of the same row: answer 'dup'), limit_prefix (lanes.keys.LIMIT_PREFIX),
--   lane_prefix (lanes.keys.LANE_PREFIX), read_estimate ('1': read the lane's
--   estimate inputs; '0': the caller has them from a recent call), dedupe ('key' |
--   'throttle' | 'debounce', tasks.dedupe), dedupe_window_ms, tombstone_ttl_s and
--   settle_lease_ms (a debounce's replaced task is cancelled as cancel.lua does),
--   caller_quota (the most tasks one token may hold waiting in the lane, its share of
--   the capacity: past it an item of that token is refused 'caller_quota'; '0': no share);
--   then ITEM_ARGS an item: task_id, message (stored compact: lanes/messages.py),
--   kombu_priority 0..9, chat ('' none), digest (of the payload; '' without an
--   idempotency key), deadline_ms, limits (its limit instance bases, newline-separated;
--   '' when its type names none: then nothing touches a limit key), due_ms ('0': now;
--   a task sent for later is stored 'scheduled' with its due time in ``eta``: runnable,
--   it waits in the delayed set with a lease at due + queued lease and promote.lua
--   publishes it; behind its chat's head it waits in the chat's queue, hand_over parks it),
--   dedupe ('1': its dedupe key is among its KEYS; '' none).
--
-- Returns {'stale', version} when the config changed (no item was looked at), else
--   {inputs, reply 1, reply 2, ...}, one reply an item, in order:
--   a number, its depth (accepted, no limit holds it, position depth + 1, its depth
--   ahead: the common reply), {'ok', position, depth, ahead},
--   {'ok', position, depth, ahead, waits_on, waiting_ahead, paused_ms} (a limit holds it),
--   {'ok', position, depth, ahead, waits_on, waiting_ahead, paused_ms, replaced, replaced_chat}
--   (a debounce replaced the task still waiting for its key: its id and chat, now cancelled
--   under a settle lease, for the caller to store its REVOKED row and settle it),
--   {'rej', reason, depth}, {'dup', task_id} (also a throttle's: the first's id) or {'conflict', task_id};
--   ``inputs``: the lane's estimate inputs {completed this minute, completed the
--   previous minute, handler seconds this minute, the previous minute's, paused 0/1,
--   live consumers}, read once a call by the first item admitted (nil when none was,
--   or read_estimate is '0'; the completions and handler seconds '0', unread, for a lane
--   paused or with no live consumer: its estimate says so without them). lanes/lua/admit.py
--   decodes all of it.
--
-- One call for a chunk: the EVALSHA, the config GET and, for a chunk of more than
-- one, the lane's shared writes (waiting count, deadlines, leases, lane lists) are
-- one each a call (pend, _admit.lua), so a plain item costs Redis its record's HSET
-- and little else (docs/redis-budget.md). A chunk of one writes at once, as many
-- commands as admission ever took for one dispatch.
--
-- Every accepted task enters the deadlines set, published or waiting behind its
-- chat's head: expire.lua makes it an ``expired`` dead letter at its deadline.
-- Because Redis runs a script alone, a dispatch appending to a chat and a worker
-- handing the chat over (finish.lua) never interleave (the seed's race cannot happen).

local SHARED_KEYS, SHARED_ARGS, ITEM_ARGS = 21, 18, 9
local c = {
  config_version = KEYS[1], leases = KEYS[2], chat_waiting = KEYS[3], delayed = KEYS[4],
  metrics_total = KEYS[5], metrics_minute = KEYS[6], metrics_previous_minute = KEYS[7], chats = KEYS[8],
  deadlines = KEYS[9], paused_lanes = KEYS[10], consumers = KEYS[11],
  lists = {KEYS[12], KEYS[13], KEYS[14], KEYS[15], KEYS[16], KEYS[17], KEYS[18], KEYS[19], KEYS[20], KEYS[21]},
  version = ARGV[1], now_ms = ARGV[2], lane = ARGV[3], task_type = ARGV[4], accepting = ARGV[5],
  capacity = tonumber(ARGV[6]), chat_queue_size = ARGV[7], idempotency_window_s = ARGV[8],
  queued_lease_ms = ARGV[9], replace_idempotency = ARGV[10] == '1', limit_prefix = ARGV[11],
  lane_prefix = ARGV[12], read_estimate = ARGV[13] == '1', dedupe = ARGV[14], dedupe_window_ms = ARGV[15],
  tombstone_ttl_s = ARGV[16], settle_lease_ms = ARGV[17], caller_quota = ARGV[18],
}
-- Numbers but the capacity stay text, each converted on the path that uses it: a tonumber is a strtod
-- (about 1K instructions), and a plain item uses none of them.
local items = (#ARGV - SHARED_ARGS) / ITEM_ARGS

-- Item ``n`` (0-based) into ``it`` (one table, reused), its keys from KEYS[k]; returns the next item's k.
local function read_item(it, n, k)
  local a = SHARED_ARGS + n * ITEM_ARGS
  it.task_id, it.message, it.kombu_priority, it.chat = ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4]
  it.digest, it.deadline_ms, it.limits, it.due_ms = ARGV[a + 5], ARGV[a + 6], ARGV[a + 7], ARGV[a + 8]
  it.record, it.idempotency, it.legacy_idempotency, it.chat_queue = KEYS[k], nil, nil, nil
  it.dedupe_key = nil
  k = k + 1
  if it.digest ~= '' then
    it.idempotency, it.legacy_idempotency = KEYS[k], KEYS[k + 1]
    k = k + 2
  end
  if it.chat ~= '' then
    it.chat_queue = KEYS[k]
    k = k + 1
  end
  if ARGV[a + 9] == '1' then
    it.dedupe_key = KEYS[k]
    k = k + 1
  end
  return k
end

--! lazy _admit_rare.lua as admit_rare
--! include _admit.lua

local version = redis.call('GET', c.config_version) or '0'
if version ~= c.version then
  return {'stale', version}
end

-- Deferred shared writes only when there are items to share them.
local pend = items > 1 and admit_rare().pend_new() or nil
-- false (a nil reply) until the estimate inputs are read: an empty table would cost Redis a table's
-- conversion (it probes each table of a reply for err, ok, double, ...: about 2.6K instructions).
local replies = {false}
local estimate = nil  -- an 'ok' reply's inputs, read once
-- Its fields named at once: a table sized for them (filled one by one, it would be rehashed four times).
local it = {task_id = nil, message = nil, kombu_priority = nil, chat = nil, digest = nil, deadline_ms = nil,
  limits = nil, due_ms = nil, record = nil, idempotency = nil, legacy_idempotency = nil, chat_queue = nil,
  dedupe_key = nil}
local k = SHARED_KEYS + 1
for n = 0, items - 1 do
  k = read_item(it, n, k)
  local read = c.read_estimate and not estimate
  local status, position, depth, ahead, waits_on, waiting_ahead, paused_ms, inputs, replaced, replaced_chat =
    admit_one(c, it, pend, read)
  if status == 'ok' then
    if read then estimate = inputs end
    if replaced then
      replies[n + 2] = {'ok', position, depth, ahead, waits_on, waiting_ahead, paused_ms, replaced, replaced_chat}
    elseif waits_on ~= '' then
      replies[n + 2] = {'ok', position, depth, ahead, waits_on, waiting_ahead, paused_ms}
    elseif position == depth + 1 and ahead == depth then
      replies[n + 2] = depth  -- the common reply, a number
    else
      replies[n + 2] = {'ok', position, depth, ahead}
    end
  else
    replies[n + 2] = {status, position, depth}  -- ('rej', reason, depth), ('dup'|'conflict', task id)
  end
end
if pend then admit_rare().pend_flush(pend, c.lane_prefix .. c.lane .. LANE_WAITING_SUFFIX, c.deadlines, c.leases) end
if estimate then replies[1] = estimate end
return replies

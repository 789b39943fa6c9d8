-- admit.lua: admission of one dispatch, and its publish, in one atomic step.
--
-- KEYS[1]  config version        KEYS[2]  task record (hash)
-- KEYS[3]  leases (zset)         KEYS[4]  idempotency key (string hash) or unused
-- KEYS[5]  chat queue (list)     KEYS[6]  lane's chat-waiting counter
-- KEYS[7]  lane delayed (zset)   KEYS[8]  metrics totals (hash)
-- KEYS[9]  metrics minute (hash) KEYS[10] active chats index (zset)
-- KEYS[11..20] the lane's ten priority lists (kombu priority 0..9)
-- ARGV: 1 expected config version, 2 now ms, 3 task id, 4 message (NUL marks
--   the delivery tag's place), 5 kombu priority 0..9, 6 accepting 0/1,
--   7 lane capacity, 8 chat id or '', 9 chat queue size, 10 payload digest or ''
--   (no idempotency key), 11 idempotency window s, 12 queued lease ms,
--   13 lane, 14 task type, 15 '1' to take over the idempotency key (a requeue;
--   its task id is derived from the dead letter, so a task record of that id
--   already here means an earlier requeue of the same row: answer 'dup')
-- KEYS[21] metrics of the previous minute (for the lane's recent completion rate)
-- KEYS[22] the idempotency key in its old, ambiguous format: read (never written)
--   when KEYS[4] is absent, until keys stored before the upgrade have expired
-- KEYS[23] deadlines of waiting tasks (zset)   KEYS[24] paused lanes (set)
-- KEYS[25] the lane's live consumers (zset: worker -> heartbeat expiry ms; lanes.consumers)
-- ARGV[16] the task's deadline, epoch ms
-- ARGV[17] the task's limit instance bases, newline-separated ('' when its type
--   names no limits: then nothing below touches a limit key), ARGV[18] limits key
--   prefix (lanes.keys.LIMIT_PREFIX), ARGV[19] lane key prefix (lanes.keys.LANE_PREFIX)
-- KEYS[26] the lane's count of tasks waiting on a limit (not read here since issue 16)
-- (No key is written for a cancel: a cancel by task id finds a chat-scoped record in the
--   deadlines and leases sets, lanes.records; the idempotency key keeps the task's chat.)
-- ARGV[20] when the task is due, epoch ms ('0': now, the plain dispatch). A task
--   sent for later (countdown / eta) is stored with st 'scheduled' and its due
--   time in the record's ``eta`` field; runnable (not chat-scoped, or its chat's
--   head) it waits in the lane's delayed set (KEYS[7], where retries wait) with a
--   lease at due + queued lease, and promote.lua publishes it when due; behind its
--   chat's head it waits in the chat's queue like any message (hand_over parks it).
-- ARGV[21] '1' to read the lane's completions, handler seconds, paused flag and live
--   consumers ('0': the caller has them from a recent call; they come back '')
-- The depth is the lane's count of tasks not claimed yet (``<ARGV[19]><lane>:waiting``,
--   kept with the deadlines set: waiting_add in _lib.lua); KEYS[26] and the lane lists'
--   lengths are no longer read (their LLENs were ten commands a dispatch).
-- Returns {'stale', version} | {'dup', task_id} | {'conflict', task_id}
--   | {'rej', reason, depth} | {'ok', position, depth, completed_this_minute,
--   completed_previous_minute, ahead, busy_s_this_minute, busy_s_previous_minute,
--   paused 0/1, live_consumers, waits_on (limit instance base or ''),
--   waiting_ahead, paused_ms}
-- ``ahead``: the lane's tasks waiting before this one (any priority, since issue 16:
-- the same as depth); ``busy_s``: the
-- handler seconds the lane's workers spent in that minute (finish.lua).
--
-- Every accepted task enters the deadlines set, published or waiting behind its
-- chat's head: expire.lua makes it an ``expired`` dead letter at its deadline
-- if no worker has claimed it by then.
--
-- Because Redis runs a script alone, a dispatch appending to a chat and a worker
-- handing the chat over (finish.lua) can never interleave: the seed's race, where
-- a hand-over deleted a queue that a submit had just found, cannot happen.

--! include _admit.lua

local version = redis.call('GET', KEYS[1]) or '0'
if version ~= ARGV[1] then
  return {'stale', version}
end
return {admit_one(KEYS, ARGV, nil)}

-- finish.lua: a task reached a terminal state; hand its chat to the next message.
--
-- KEYS[1] task record   KEYS[2] leases   KEYS[3] chat queue (or the record)
-- KEYS[4] active chats index   KEYS[5] metrics totals   KEYS[6] metrics minute
-- KEYS[7] the task's tombstone (outcome and result, for a late redelivery)
-- KEYS[8] deadlines of waiting tasks (a finished task leaves it)
-- ARGV: 1 task id, 2 outcome ('done'|'dead'|'cancelled': a running task told by cancel.lua that stopped), 3 result JSON, 4 now ms,
--   5 seconds to keep the tombstone,
--   6 queued lease ms, 7 chat id or '', 8 chat record prefix,
--   9 metric field suffix ('lane|type'), 10 outcome detail (dead reason or ''),
--   11 execution-latency bucket label or '', 12 chat-waiting key prefix,
--   13 execution latency in seconds (9-11 and 13: counted by the wrapper, in
--   process, since issue 16: lanes.counters), 14 owner that claimed this attempt ('' when
--   the task is dead-lettered without a claim, e.g. poison), 15 settle lease ms,
--   16 limits key prefix, 17 lane key prefix (a task with limits gives its slots
--   back here, and each freed slot goes to the next waiting task in this call)
-- Returns {'ok', next_task_id or ''} | {'already', state} | {'gone'}
--   | {'taken', owner}
--
-- A worker re-sends this call when Redis did not answer (it may have run): a
-- second run finds the record gone and changes nothing. 'taken' means another
-- worker claimed the task since (our lease ran out while Redis was away): that
-- attempt will finish it, so this one must not hand the chat over under it.
--
-- The hand-over (pop the head, publish the next) and a dispatch's append
-- (admit.lua) are each one script, so they never interleave: a chat queue is
-- deleted by Redis only when this pop empties it, and an append after that
-- simply creates it again with the new message as head.

local f = redis.call('HMGET', KEYS[1], 'st', 'lane', 'own', 'lim')
local st = f[1]
if not st then return {'gone'} end
if st == 'done' or st == 'dead' or st == 'cancelled' then return {'already', st} end
if ARGV[14] ~= '' and st == 'running' and f[3] ~= ARGV[14] then return {'taken', f[3]} end
local lane = f[2]
-- The record keeps the outcome, under a short lease, until the worker has
-- stored the result row and settles it (forget.lua, batched): a worker killed
-- in between has its message republished by the sweep when the lease runs out,
-- and that delivery stores the result from here (start.lua answers 'finished').
-- The broker keeps no copy of a running task (lanes.transport), so this lease
-- is what brings the result row back. Settled, the record goes away with the
-- task, so a finished chat leaves no key behind; a small tombstone outside the
-- chat's keys answers any copy still in the broker for a while.
redis.call('HSET', KEYS[1], 'st', ARGV[2], 'res', ARGV[3], 'own', '')
redis.call('SET', KEYS[7], ARGV[2] .. '|' .. ARGV[3], 'EX', tonumber(ARGV[5]))
-- A task claimed by this attempt keeps the lease of its claim: set by start.lua,
-- renewed by its process's beat every third of it while it ran, so at least two
-- thirds of DISPATCH_LEASE_S are left (settling takes a fraction of a second;
-- a lease that ran out anyway only has the sweep republish the finished record,
-- whose copy re-stores the result row), and it left the deadlines set at the claim. Only a task finished without a claim (poison,
-- expired before it ran) gets the settle lease and leaves the set here.
if not (st == 'running' and ARGV[14] ~= '' and f[3] == ARGV[14]) then
  redis.call('ZADD', KEYS[2], tonumber(ARGV[4]) + tonumber(ARGV[15]), KEYS[1])
  if KEYS[8] then waiting_remove(KEYS[8], KEYS[1], ARGV[17], lane) end
end

-- Its counts (succeeded, dead or cancelled, completed per lane, execution latency, the
-- lane's handler seconds) are the caller's, kept in process (lanes.counters):
-- only an 'ok' reply counts them.

local now = tonumber(ARGV[4])
lim_setup(ARGV[16], ARGV[17], KEYS[5], KEYS[6], now, KEYS[2], now + tonumber(ARGV[6]))
if f[4] then lim_release(KEYS[1], f[4]) end

local next_id = ''
if ARGV[7] ~= '' and redis.call('LINDEX', KEYS[3], 0) == ARGV[1] then
  next_id = hand_over(KEYS[3], ARGV[7], ARGV[8], KEYS[4], KEYS[2],
    tonumber(ARGV[4]) + tonumber(ARGV[6]), ARGV[12])
end
return {'ok', next_id}

-- forget.lua: settle finished tasks whose result rows are stored (a batch).
--
-- KEYS: index (leases, or the expired-pending set), then the task records (from RECORDS on)
-- Returns the number of records removed.
--
-- finish.lua (and cancel.lua) leave a finished record (state done, dead or
-- cancelled) under a lease until its worker (or canceller) has stored the
-- result row; the worker then sends the records it stored since its last call
-- here (expire.lua's caller does the same with the rows of expired tasks).
-- Only such records are ever named here, and nothing moves a record out of
-- 'done', 'dead' or 'cancelled' (a republished copy keeps the state), so the
-- state is not read again, and the records go in one DEL and one ZREM per
-- ``CHUNK`` of them: a settling thread sends every record it settled in the
-- last tenth of a second, so that is a small fraction of a command per task
-- instead of three (docs/redis-budget.md). A record already gone
-- (settled by another copy's worker) is simply not counted.

local index, RECORDS, records = KEYS[1], 2, KEYS

local CHUNK = 200  -- records per command (unpack's arguments stay far below Lua's stack limit)
local removed = 0
for first = RECORDS, #records, CHUNK do
  local last = math.min(first + CHUNK - 1, #records)
  removed = removed + redis.call('DEL', unpack(records, first, last))
  redis.call('ZREM', index, unpack(records, first, last))
end
return removed

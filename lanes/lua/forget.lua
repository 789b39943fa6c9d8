-- forget.lua: settle finished tasks whose result rows are stored (a batch).
--
-- KEYS[1] leases (or the expired-pending set)   KEYS[2..] task records
-- Returns the number of records removed.
--
-- finish.lua (and cancel.lua) leave a finished record (state done, dead or
-- cancelled) under a lease until its worker (or canceller) has stored the
-- result row; the worker then sends the records it stored since its last call
-- here (expire.lua's caller does the same with the rows of expired tasks).
-- Only such records are ever named here, and nothing moves a record out of
-- 'done', 'dead' or 'cancelled' (a republished copy keeps the state), so the
-- state is not read again: since issue 16 a settle is two commands a record,
-- not three (docs/redis-budget.md). A record already gone (settled by another
-- copy's worker) costs a DEL that deletes nothing.

local removed = 0
for i = 2, #KEYS do
  removed = removed + redis.call('DEL', KEYS[i])
  redis.call('ZREM', KEYS[1], KEYS[i])
end
return removed

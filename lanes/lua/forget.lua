-- forget.lua: settle finished tasks whose result rows are stored (a batch).
--
-- KEYS[1] leases   KEYS[2..] task records
-- Returns the number of records removed.
--
-- finish.lua leaves a finished record (state done, dead or cancelled; cancel.lua too) under a short lease
-- until its worker has stored the result row; the worker then sends the
-- records it stored since its last call here. A record in any other state is
-- left alone: only a finished task is forgotten.

local removed = 0
for i = 2, #KEYS do
  local st = redis.call('HGET', KEYS[i], 'st')
  if st == 'done' or st == 'dead' or st == 'cancelled' then
    redis.call('DEL', KEYS[i])
    redis.call('ZREM', KEYS[1], KEYS[i])
    removed = removed + 1
  end
end
return removed

-- pop_more.lua: after a BRPOP delivered a message, take up to ARGV[1] more from the
-- lane lists KEYS[3..] (BRPOP's order: the lane's priorities), from their right end
-- as BRPOP does, and name the record of each leased one in the popping process's
-- in-hand set KEYS[1] in the same call, so that nothing it pops is in no set
-- (lanes/transport.py, docs/liveness.md).
--
-- The record is read from the message as lanes/messages.py writes it (compact
-- JSON; not decoded: the delivery tag placeholder is a NUL that cjson refuses).
-- ARGV[2], when not empty, is the process's entry for KEYS[2] (the process list),
-- written with expiry ARGV[3] if it has none yet.
-- Returns message, record named ('' for none), message, record, ...
local want = tonumber(ARGV[1])
local out, records, n = {}, {}, 0
for i = 3, #KEYS do
  if n >= want then break end
  local got = redis.call('RPOP', KEYS[i], want - n)
  if got then
    for _, item in ipairs(got) do
      n = n + 1
      local record = ''
      if string.find(item, '"dispatch_leased":true', 1, true) then
        record = string.match(item, '"dispatch_record":"([^"\\]+)"') or ''
      end
      if record ~= '' then records[#records + 1] = record end
      out[#out + 1] = item
      out[#out + 1] = record
    end
  end
end
if #records > 0 then
  redis.call('SADD', KEYS[1], unpack(records))
  if ARGV[2] ~= '' then redis.call('ZADD', KEYS[2], 'NX', ARGV[3], ARGV[2]) end
end
return out

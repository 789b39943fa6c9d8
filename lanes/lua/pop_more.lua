-- pop_more.lua: a worker's only pop of lane messages (lanes/transport.py): up to
-- ARGV[1] messages from the lane lists KEYS[4..] (kombu priority 0 first, from
-- their right end as BRPOP pops), the record of each leased one named in the
-- popping process's in-hand set KEYS[1] in the same call, so that nothing it
-- pops is ever in no set: a process killed at any moment left each message it
-- took either in its list or named in its set, where reclaim.lua finds it
-- (docs/liveness.md).
--
-- KEYS[1] the process's in-hand set   KEYS[2] live processes (zset)
-- KEYS[3] the lane's doorbell (lanes.keys.lane_doorbell)   KEYS[4..] the lane's
--   lists, list p holding kombu priority p
-- ARGV[1] most messages to take   ARGV[2] the process's entry for KEYS[2] ('' once
--   it has one), written with expiry ARGV[3] if it has none yet
-- ARGV[4] the lists to look at: the doorbell token's bits (bit p: list p, as
--   _lib.lua's ring writes them), or '' for every list (the worker's poll)
--
-- Only the lists a token names are looked at, so a lane that keeps up pays one
-- RPOP a message. The poll looks at every list (unrung pushes, a token lost with a
-- killed worker): one EXISTS tells how many hold anything, and it stops once it
-- has met them. A call that filled its room and may have left messages behind
-- rings the doorbell again (the lists it did not finish), so another idle worker
-- wakes (chain wake).
--
-- The record is read from the message as lanes/messages.py writes it (compact
-- JSON; the message not decoded whole: the delivery tag placeholder is a NUL that
-- cjson refuses; only the record's own string is, when it holds an escape).
-- Returns message, record named ('' for none), message, record, ...

-- The record key as a JSON string: a plain one read as it is, one holding an escape
-- (a chat id with '"' or '\') up to its first unescaped quote and decoded by cjson.
local function record_of(item)
  local plain = string.match(item, '"dispatch_record":"([^"\\]*)"')
  if plain then return plain end
  local _, open = string.find(item, '"dispatch_record":"', 1, true)
  if not open then return '' end
  local close = open
  repeat
    close = string.find(item, '"', close + 1, true)
    if not close then return '' end
    local slashes = 0
    while string.byte(item, close - 1 - slashes) == 92 do slashes = slashes + 1 end
  until slashes % 2 == 0
  local ok, record = pcall(cjson.decode, string.sub(item, open, close))
  if ok and type(record) == 'string' then return record end
  return ''
end

local want = tonumber(ARGV[1])
local lists = #KEYS - 3
local bits = tonumber(ARGV[4]) or bit.lshift(1, lists) - 1
local left = lists  -- lists known to hold something not met yet (all: the token says nothing more)
if ARGV[4] == '' then left = redis.call('EXISTS', unpack(KEYS, 4)) end
local out, records, n = {}, {}, 0
local behind = 0  -- bits of the lists that may still hold messages when the room is full
for p = 0, lists - 1 do
  local bit_p = bit.lshift(1, p)
  if bit.band(bits, bit_p) ~= 0 and left > 0 then
    if n >= want then
      behind = bit.bor(behind, bit_p)
    else
      local asked = want - n
      local got = redis.call('RPOP', KEYS[4 + p], asked)
      if got then
        left = left - 1
        if #got == asked then behind = bit.bor(behind, bit_p) end
        for _, item in ipairs(got) do
          n = n + 1
          local record = ''
          if string.find(item, '"dispatch_leased":true', 1, true) then record = record_of(item) end
          if record ~= '' then records[#records + 1] = record end
          out[#out + 1] = item
          out[#out + 1] = record
        end
      end
    end
  end
end
if #records > 0 then
  redis.call('SADD', KEYS[1], unpack(records))
  if ARGV[2] ~= '' then redis.call('ZADD', KEYS[2], 'NX', ARGV[3], ARGV[2]) end
end
if behind ~= 0 then ring(KEYS[3], behind) end
return out

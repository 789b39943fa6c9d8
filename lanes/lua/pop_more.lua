-- pop_more.lua: a worker's only pop of lane messages (lanes/transport.py): up to
-- ``want`` items from the lane's lists (kombu priority 0 first, from their right
-- end as BRPOP pops), the record of each leased one named in the popping
-- process's in-hand set in the same call, so that nothing it pops is ever in no
-- set: a process killed at any moment left each message it took either in its
-- list or named in its set, where reclaim.lua finds it (docs/liveness.md).
--
-- KEYS: in_hand (the process's in-hand set), procs (live processes, zset), bell
--   (the lane's doorbell, lanes.keys.lane_doorbell), held (the process's held set),
--   leases, config_version, deadlines (as start.lua's), then the lane's lists (list
--   p holding kombu priority p)
-- ARGV: want (most items to take), register (the process's entry for procs, ''
--   once it has one), register_ms (its expiry, written if it has none yet), bits
--   (the lists to look at: the doorbell token's bits, bit p: list p, as _lib.lua's
--   ring writes them; '' for every list: the worker's poll), then the claim at the
--   pop: claim_max (most items to claim; 0: none), handlers (the handlers whose
--   messages may be claimed, each between newlines), owner_prefix (item i claimed
--   is owned by owner_prefix .. i), now_ms, lease_ms, max_deliveries, lane_prefix,
--   chat_prefix; then queued_lease_ms (the queued lease of a 'queued' record popped and not claimed)
--
-- The queued lease is written here, not at admission: a record waiting in its list needs none (its
-- copy is there; audit.lua finds one lost from an empty list), and one that leaves its list leaves
-- it in this call, so a copy the popping process loses unclaimed (its reply lost, its claim met Redis
-- away) is republished by the sweep once this lease runs out, as admission's lease had it. Each
-- 'queued' record popped and not claimed here gets now + queued_lease_ms (what it had from an
-- earlier publish, or a parked '+inf', replaced: it left its list now); in the claims' ZADD when the
-- call claims, else in one ZADD of its own (one a pop, not a task). A record in any other state keeps
-- its lease (a claim's, a finished record's settle lease).
--
-- The claim at the pop (tasks/grouping.py): a worker whose run threads are idle has
-- up to claim_max of the records it pops claimed here, each exactly as start.lua
-- claims one (claim_fields, _claim.lua, on the fields read with the message: one
-- HMGET for both), their writes once per call (claim_flush: leases, deadlines and
-- waiting count, held set), so the worker skips the claim's round trip. Only a
-- message that the claim would run is taken so: a 'queued' record of a handler named
-- in handlers, under its delivery cap, and its chat's head; any other (a batched
-- handler's, a chat-blocked one, past the cap, beyond claim_max) is delivered as
-- before, named in the in-hand set, and claimed (or refused) by the worker's own call.
-- A claimed record is named in the held set, not the in-hand set: reclaim.lua hands
-- it on if the process dies before it runs, as any claim (docs/liveness.md).
--
-- A lane list's item names a record (``<record>#<publish>``, _lib.lua's
-- publish_record): the message is the record's ``msg`` (lanes/messages.py's
-- stored form), read here. A copy whose publish is not the record's last (the
-- sweep published it again) or whose record is gone (finished and settled) is
-- dropped: the last copy is the one that counts, and a settled record has nothing
-- left to run. Any other item (a whole message: kombu's own publish, or one a
-- worker pushed back) is returned as it is, its record named in the in-hand set
-- when it is leased.
--
-- Only the lists a token names are looked at, so a lane that keeps up pays one
-- RPOP (with a count) a list, and an HMGET an item. Redis 6.2's RPOP with a count
-- walks the list from its head (O(backlog), BENCHMARKS.md); Valkey 8.1 (make run's
-- and the tests' server) does not, so the count stays (a loop of RPOPs would be one
-- more command a task). A dropped copy leaves the call short of its room. The poll looks at every
-- list (unrung pushes, a token lost with a killed worker): one EXISTS tells how
-- many hold anything, and it stops once it has met them. A call that filled its
-- room and may have left items behind rings the doorbell again (the lists it did
-- not finish), so another idle worker wakes (chain wake).
--
-- Returns the config version ('' when nothing was claimed), then per message: its text, its
-- record ('' for none), its delivery tag ('': a whole message, which carries its own), its
-- claim's owner ('' when not claimed here), then the next message's four.

local in_hand, procs, bell, held, leases, config_version, deadlines = unpack(KEYS, 1, 7)
local want, register, register_ms, bits_arg = tonumber(ARGV[1]), ARGV[2], ARGV[3], ARGV[4]
local claim_max, handlers, owner_prefix, now_ms, lease_ms, max_deliveries, lane_prefix, chat_prefix =
  tonumber(ARGV[5]), ARGV[6], ARGV[7], ARGV[8], ARGV[9], ARGV[10], ARGV[11], ARGV[12]
local queued_lease_ms = tonumber(ARGV[13])
local lane_lists = {unpack(KEYS, 8)}
local lists = #lane_lists

--! include _claim.lua

local c = {
  leases = leases, deadlines = deadlines, procs = procs, held = held, now = tonumber(now_ms),
  lease_ms = tonumber(lease_ms), max_dlv = tonumber(max_deliveries), process = '',
  liveness_ms = 0, lane_prefix = lane_prefix,  -- the pop registers the process itself (register)
  leased = {}, claimed = {}, seen = {}, by_lane = {}, lanes = {},
}
local READ = {unpack(CLAIM_READ)}
READ[#READ + 1] = 'msg'
READ[#READ + 1] = 'pub'
local MSG, PUB = #CLAIM_READ + 1, #CLAIM_READ + 2

-- Whether this worker's run threads take ``msg`` claimed (its handler, from the stored message's
-- first line: lanes/messages.py's build_message).
local function claimable(msg)
  local handler = string.match(msg, '^%["([^"\\]*)"')
  return handler ~= nil and string.find(handlers, '\n' .. handler .. '\n', 1, true) ~= nil
end

-- The record key of a whole message as a JSON string: a plain one read as it is, one
-- holding an escape (a chat id with '"' or '\') up to its first unescaped quote and
-- decoded by cjson (the message not decoded whole: it may be large).
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

local bits = tonumber(bits_arg) or bit.lshift(1, lists) - 1
local left = lists  -- lists known to hold something not met yet (all: the token says nothing more)
if bits_arg == '' then left = redis.call('EXISTS', unpack(lane_lists)) end
local out, records, n = {''}, {}, 0
local queued = {}  -- the queued leases of the 'queued' records popped and not claimed: score, record, ...
local behind = 0  -- bits of the lists that may still hold messages when the room is full
for p = 0, lists - 1 do
  local bit_p = bit.lshift(1, p)
  if bit.band(bits, bit_p) ~= 0 and left > 0 then
    if n >= want then
      behind = bit.bor(behind, bit_p)
    else
      local asked = want - n
      local got = redis.call('RPOP', lane_lists[p + 1], asked)
      if got then
        left = left - 1
        if #got == asked then behind = bit.bor(behind, bit_p) end
        for _, item in ipairs(got) do
          local record, pub = list_item_parts(item)
          if not record then  -- a whole message
            local named = ''
            if string.find(item, '"dispatch_leased":true', 1, true) then named = record_of(item) end
            if named ~= '' then records[#records + 1] = named end
            n = n + 1
            out[#out + 1] = item
            out[#out + 1] = named
            out[#out + 1] = ''
            out[#out + 1] = ''
          else
            local f = redis.call('HMGET', record, unpack(READ))
            if f[MSG] and f[PUB] == pub then
              local task_id = string.match(record, '([^:]+)$')
              local owner = ''
              if #c.claimed < claim_max and f[CLAIM_ST] == 'queued' and tonumber(f[CLAIM_DLV] or '0') < c.max_dlv
                  and claimable(f[MSG]) then
                local chat, chat_queue = f[CLAIM_CHAT], ''
                if chat and chat ~= '' then chat_queue = chat_tag(chat_prefix, chat) .. CHAT_QUEUE_SUFFIX end
                owner = owner_prefix .. (#c.claimed + 1)
                if claim_fields(c, record, f, task_id, f[CLAIM_ATT], owner, '', chat_queue, '') ~= 'run' then owner = '' end
              end
              if owner == '' then
                records[#records + 1] = record
                if f[CLAIM_ST] == 'queued' then
                  queued[#queued + 1] = c.now + queued_lease_ms
                  queued[#queued + 1] = record
                end
              end
              n = n + 1
              out[#out + 1] = f[MSG]
              out[#out + 1] = record
              out[#out + 1] = task_id .. '.' .. pub
              out[#out + 1] = owner
            end
          end
        end
      end
    end
  end
end
if #records > 0 then redis.call('SADD', in_hand, unpack(records)) end
if #c.claimed > 0 then
  for _, v in ipairs(queued) do c.leased[#c.leased + 1] = v end  -- one ZADD with the claims' leases
  claim_flush(c)
  out[1] = redis.call('GET', config_version) or '0'
elseif #queued > 0 then
  redis.call('ZADD', leases, unpack(queued))
end
if register ~= '' and (#records > 0 or #c.claimed > 0) then redis.call('ZADD', procs, 'NX', register_ms, register) end
if behind ~= 0 then ring(bell, behind) end
return out

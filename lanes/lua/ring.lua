-- ring.lua: ring a lane's doorbell after a push made outside the platform's scripts
-- (lanes/transport.py: a message published or handed back through the broker
-- channel onto a lane list). _lib.lua's ring: at most one token, its bits the lists
-- pushed since it was rung.
--
-- KEYS: doorbell (the lane's, lanes.keys.lane_doorbell)
-- ARGV: bits (of the lists pushed; bit p: the lane's list of kombu priority p)
local doorbell = KEYS[1]
local bits = tonumber(ARGV[1])

ring(doorbell, bits)
return 1

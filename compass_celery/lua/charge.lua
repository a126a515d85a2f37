-- Add ARGV[2] ms to a worker's counter in hash KEYS[1] (field ARGV[1]),
-- never letting it go below zero (a late decrement after a reconcile).
local v = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0') or 0
v = v + tonumber(ARGV[2])
if v < 0 then v = 0 end
redis.call('HSET', KEYS[1], ARGV[1], tostring(v))
return tostring(v)

-- Move the next staged entry to its destination, if it is still the one the caller read.
-- KEYS: 1 staging list, 2 destination list, 3 (optional) the destination queue's bell
-- ARGV: 1 the entry read, 2 what to push, 3 the bell's expiry (ms; with KEYS[3])
-- Returns 1 when moved, 0 when another drainer took it first (nothing is done then).
if redis.call('LINDEX', KEYS[1], -1) ~= ARGV[1] then return 0 end
redis.call('RPOP', KEYS[1])
redis.call('LPUSH', KEYS[2], ARGV[2])
if KEYS[3] then
  redis.call('LPUSH', KEYS[3], '1')  -- wakes the queue's idle consumer
  redis.call('PEXPIRE', KEYS[3], ARGV[3])
end
return 1

-- The ageing rule's one step: move a waiting message to a higher priority list, at the
-- end kombu pops next, if it still waits where the caller saw it.
-- KEYS: 1 the list it waits in, 2 the higher list, 3 the queue's bell
-- ARGV: 1 the message as read, 2 the bell's expiry (ms)
-- Returns 1 when moved, 0 when a consumer (or another promoter) took it first.
if redis.call('LREM', KEYS[1], -1, ARGV[1]) == 0 then return 0 end
redis.call('RPUSH', KEYS[2], ARGV[1])
redis.call('LPUSH', KEYS[3], '1')  -- an idle consumer looks again
redis.call('PEXPIRE', KEYS[3], ARGV[2])
return 1

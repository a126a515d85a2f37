-- Put back a message fetch.lua took into flight that its worker will not run now (it
-- woke on another queue's message in the same round: prefetch stays one): out of
-- kombu's unacked hash and index and the leases, onto the end of its list taken next,
-- with a token on its queue's bell, in one step.
-- KEYS: 1 kombu's unacked hash, 2 kombu's unacked_index zset, 3 compass leases zset,
--       4 the list it was taken from, 5 its queue's bell
-- ARGV: 1 its delivery tag, 2 the raw message, 3 the bell's expiry (ms)
-- Returns 1 when put back, 0 when it was no longer in flight (nothing is done then).
if redis.call('HDEL', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('RPUSH', KEYS[4], ARGV[2])
redis.call('LPUSH', KEYS[5], '1')
redis.call('PEXPIRE', KEYS[5], ARGV[3])
return 1

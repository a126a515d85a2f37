-- kombu's push of one message onto a compass queue and a token on the queue's bell, in one
-- step (one EVALSHA, where a MULTI/EXEC of the same commands cost twice a plain push).
-- KEYS: 1 the list kombu pushes it to (its _q_for_pri), 2 the queue's bell,
--       3.. the queue's lists kombu gives an expiry (a queue with x-expires)
-- ARGV: 1 the message, 2 the bell's expiry (ms), 3 the lists' expiry (ms; with KEYS[3..])
-- Returns 1.
redis.call('LPUSH', KEYS[1], ARGV[1])
for k = 3, #KEYS do redis.call('PEXPIRE', KEYS[k], ARGV[3]) end
redis.call('LPUSH', KEYS[2], '1')  -- wakes the queue's idle consumer
redis.call('PEXPIRE', KEYS[2], ARGV[2])
return 1

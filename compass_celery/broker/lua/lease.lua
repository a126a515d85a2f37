-- Renew the leases of a worker's in-flight messages.
-- KEYS: 1 compass leases zset, 2 kombu's unacked_index zset, 3 kombu's unacked hash
-- ARGV: 1 the host's time (kombu compares its index with host clocks), 2.. delivery tags
-- Our lease is stamped with Redis TIME; kombu's index is moved forward so its
-- visibility timeout never redelivers a task that is still running.
-- Returns the tags no longer in flight (acked): the caller forgets them.
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local gone = {}
for i = 2, #ARGV do
  if redis.call('HEXISTS', KEYS[3], ARGV[i]) == 1 then
    redis.call('ZADD', KEYS[1], now, ARGV[i])
    redis.call('ZADD', KEYS[2], 'XX', tonumber(ARGV[1]), ARGV[i])
  else
    redis.call('ZREM', KEYS[1], ARGV[i])
    table.insert(gone, ARGV[i])
  end
end
return gone

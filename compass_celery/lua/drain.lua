-- Take every message of a dead worker's queue, and its in-flight (unacked)
-- messages, out of Redis in one step, so exactly one drainer re-places them.
-- KEYS: 1 the worker's queue list, 2 kombu's unacked hash, 3 kombu's unacked_index zset
-- ARGV: 1 the queue's routing key
-- Returns {waiting messages..., '--inflight--', raw unacked entries [msg, exchange, key]...}
local out = redis.call('LRANGE', KEYS[1], 0, -1)
redis.call('DEL', KEYS[1])
table.insert(out, '--inflight--')
local all = redis.call('HGETALL', KEYS[2])
for i = 1, #all, 2 do
  local ok, entry = pcall(cjson.decode, all[i + 1])
  if ok and type(entry) == 'table' and entry[3] == ARGV[1] then
    table.insert(out, all[i + 1])
    redis.call('HDEL', KEYS[2], all[i])
    redis.call('ZREM', KEYS[3], all[i])
  end
end
return out

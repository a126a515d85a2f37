-- Forget a worker: its record, beat, backlog and pending, logged so readers drop it.
-- (changelog.lua is put in front of this script.)
-- KEYS: 1 workers hash, 2 beats zset, 3 backlog hash, 4 pending hash, 5 state log hash,
--       6 changes zset, 7 worker-stats hash
-- ARGV: 1 worker name, 2 epoch candidate, 3 change-log size
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
redis.call('HDEL', KEYS[4], ARGV[1])
redis.call('HDEL', KEYS[7], ARGV[1])
for _, kind in ipairs({'w:', 'b:', 'p:'}) do
  log_change(KEYS[5], KEYS[6], ARGV[2], ARGV[3], kind .. ARGV[1])
end
return 1

-- Forget a worker: its record, beat and counters, logged so readers drop it.
-- (changelog.lua is put in front of this script.)
-- KEYS: 1 workers hash, 2 beats zset, 3 backlog hash, 4 pending hash, 5 state log hash,
--       6 changes zset, 7 worker-stats hash, 8 queued hash, 9 forming hash,
--       10 pending-queued hash
-- ARGV: 1 worker name, 2 epoch candidate, 3 change-log size, 4 the separator after a
--       worker's name in a queued or forming member (keys.MEMBER_SEP)
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
redis.call('HDEL', KEYS[4], ARGV[1])
redis.call('HDEL', KEYS[7], ARGV[1])
-- its queued and planned work per priority level and its counts of waiting batch inputs
local head = ARGV[1] .. ARGV[4]
for _, pair in ipairs({{KEYS[8], 'q:'}, {KEYS[9], 'i:'}, {KEYS[10], 'r:'}}) do
  for _, member in ipairs(redis.call('HKEYS', pair[1])) do
    if string.sub(member, 1, #head) == head then
      redis.call('HDEL', pair[1], member)
      log_change(KEYS[5], KEYS[6], ARGV[2], ARGV[3], pair[2] .. member)
    end
  end
end
for _, kind in ipairs({'w:', 'b:', 'p:'}) do
  log_change(KEYS[5], KEYS[6], ARGV[2], ARGV[3], kind .. ARGV[1])
end
return 1

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
-- its queued work per priority level and its counts of waiting batch inputs: the
-- backlog members "<worker>\31<level>" and "<worker>\30<batch key>"
local by_level, by_batch = ARGV[1] .. '\31', ARGV[1] .. '\30'
for _, member in ipairs(redis.call('HKEYS', KEYS[3])) do
  local head = string.sub(member, 1, #by_level)
  if head == by_level or head == by_batch then
    redis.call('HDEL', KEYS[3], member)
    log_change(KEYS[5], KEYS[6], ARGV[2], ARGV[3], 'b:' .. member)
  end
end
for _, kind in ipairs({'w:', 'b:', 'p:'}) do
  log_change(KEYS[5], KEYS[6], ARGV[2], ARGV[3], kind .. ARGV[1])
end
return 1

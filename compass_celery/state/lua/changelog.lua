-- Shared head of every script that changes cluster state (scripts.register_script puts
-- it in front of publish, counter, remove and the jobs' once): log_change notes that MEMBER changed, so a
-- reader fetches only what changed since its last read instead of every record.
--   log      hash  {version, epoch, floor}
--   changes  zset  member ('w:'/'b:'/'p:'/'f:' + name) -> version of its latest change
-- The epoch is set once, from the writer's random candidate: a Redis that lost its data
-- (restart without persistence, FLUSHALL) gets a new one, and readers read everything
-- again even though the version counter starts over. The zset keeps the KEEP newest
-- members; floor is the newest version trimmed, and a reader whose last version is
-- below it has missed changes, so it reads everything again.
local function log_change(log, changes, epoch, keep, member)
  redis.call('HSETNX', log, 'epoch', epoch)
  local v = redis.call('HINCRBY', log, 'version', 1)
  redis.call('ZADD', changes, v, member)
  local extra = redis.call('ZCARD', changes) - tonumber(keep)
  if extra > 0 then
    local gone = redis.call('ZPOPMIN', changes, extra)
    redis.call('HSET', log, 'floor', gone[#gone])
  end
  return v
end

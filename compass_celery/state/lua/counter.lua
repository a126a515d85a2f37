-- Change one per-worker counter (keys.COUNTERS) and log the change for readers.
-- (changelog.lua is put in front of this script.)
-- KEYS: 1 counter hash, 2 state log hash, 3 changes zset
-- ARGV: 1 field, 2 ms, 3 mode ('add': add ms; 'set': overwrite), 4 change-log
--       member, 5 epoch candidate, 6 change-log size
-- Additions commute: a worker's release may land before the producer's charge (charges
-- are written in batches, off the enqueue path), so a counter may go below zero for a
-- moment; readers see it as zero (records.decode_ms), and a reconcile ('set') never
-- writes below zero. Returns {new value, version, epoch} when the change was logged, so
-- the writer's own reader can skip it (snapshot.lua), or {new value} when the value did
-- not change (nothing logged).
local old = redis.call('HGET', KEYS[1], ARGV[1])
local v = tonumber(ARGV[2])
if ARGV[3] == 'add' then
  v = v + (tonumber(old or '0') or 0)
end
if v < 0 and ARGV[3] == 'set' then v = 0 end
local new = tostring(v)
if new ~= old then
  redis.call('HSET', KEYS[1], ARGV[1], new)
  local version = log_change(KEYS[2], KEYS[3], ARGV[5], ARGV[6], ARGV[4])
  return {new, version, redis.call('HGET', KEYS[2], 'epoch')}
end
return {new}

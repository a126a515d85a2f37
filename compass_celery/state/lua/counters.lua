-- Change per-worker counters (keys.COUNTERS), any number in one call, and log each change
-- for readers. (changelog.lua is put in front of this script.) One call for a producer's
-- whole flush of charges or a worker's whole reconcile: a script call per counter cost
-- its sender more than the change itself.
-- KEYS: 1 state log hash, 2 changes zset, 3.. the counter hashes the changes name
-- ARGV: 1 epoch candidate, 2 change-log size, 3 each counter hash's change-log letter,
--       in KEYS order from KEYS[3]; then 4 values a change: its hash's KEYS index, field,
--       ms, mode ('add': add ms; 'set': overwrite)
-- Additions commute: a worker's release may land before the producer's charge (charges
-- are written in batches, off the enqueue path), so a counter may go below zero for a
-- moment; readers see it as zero (records.decode_ms), and a reconcile ('set') never
-- writes below zero. Returns {epoch, then new value and version a change}: version 0
-- when the value did not change (nothing logged), so the writer's own reader can skip
-- the changes it logged (snapshot.lua).
local out = {''}
local logged = false
for i = 4, #ARGV, 4 do
  local key = tonumber(ARGV[i])
  local field = ARGV[i + 1]
  local old = redis.call('HGET', KEYS[key], field)
  local v = tonumber(ARGV[i + 2])
  if ARGV[i + 3] == 'add' then
    v = v + (tonumber(old or '0') or 0)
  end
  if v < 0 and ARGV[i + 3] == 'set' then v = 0 end
  local new = tostring(v)
  local version = 0
  if new ~= old then
    redis.call('HSET', KEYS[key], field, new)
    local letter = string.sub(ARGV[3], key - 2, key - 2)
    version = log_change(KEYS[1], KEYS[2], ARGV[1], ARGV[2], letter .. ':' .. field)
    logged = true
  end
  out[#out + 1] = new
  out[#out + 1] = version
end
if logged then out[1] = redis.call('HGET', KEYS[1], 'epoch') end
return out

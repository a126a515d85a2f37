-- Move compass queues' messages into their staging lists, in one atomic step.
-- KEYS: 1 kombu's unacked hash, 2 kombu's unacked_index zset, 3 compass leases zset,
--       then per queue: its staging list, then its lists (main first, then priorities)
-- ARGV: 1 lease timeout (s), 2 '1' to take in-flight entries too, 3 number of queues,
--       then per queue: its routing key, its number of lists, and '1' when only in-flight
--       entries with a lapsed lease are taken (a queue others share: an entry with no
--       lease is not known to be a dead worker's), else '0'
-- Returns per queue: {staged now, in-flight entries kept because their lease is live}.
-- Waiting messages keep their order (a list's next message is its right end, and
-- staging is consumed from the right); in-flight ones go to the right end, first out.
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local timeout = tonumber(ARGV[1])
local nq = tonumber(ARGV[3])
local k, a = 4, 4
local index, staging, counts, leased_only = {}, {}, {}, {}
for q = 1, nq do
  local rk, nl = ARGV[a], tonumber(ARGV[a + 1])
  leased_only[q] = ARGV[a + 2] == '1'
  a = a + 3
  staging[q] = KEYS[k]
  index[rk] = q
  k = k + 1
  counts[2 * q - 1], counts[2 * q] = 0, 0
  for _ = 1, nl do
    local n = redis.call('LLEN', KEYS[k])
    for _ = 1, n do redis.call('RPOPLPUSH', KEYS[k], staging[q]) end
    counts[2 * q - 1] = counts[2 * q - 1] + n
    k = k + 1
  end
end
if ARGV[2] == '1' then
  local all = redis.call('HGETALL', KEYS[1])
  for i = 1, #all, 2 do
    local ok, entry = pcall(cjson.decode, all[i + 1])
    if ok and type(entry) == 'table' and type(entry[3]) == 'string' and index[entry[3]] then
      local q = index[entry[3]]
      local lease = redis.call('ZSCORE', KEYS[3], all[i])
      if lease and now - tonumber(lease) < timeout then
        counts[2 * q] = counts[2 * q] + 1
      elseif leased_only[q] and not lease then
        counts[2 * q] = counts[2 * q]  -- not ours to judge: kombu's visibility timeout
      else
        redis.call('RPUSH', staging[q], all[i + 1])
        redis.call('HDEL', KEYS[1], all[i])
        redis.call('ZREM', KEYS[2], all[i])
        redis.call('ZREM', KEYS[3], all[i])
        counts[2 * q - 1] = counts[2 * q - 1] + 1
      end
    end
  end
end
return counts

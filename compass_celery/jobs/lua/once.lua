-- Add amounts to per-worker counters once per token, and log the changes for readers: a
-- submission's retry after a lost reply must not count its work twice.
-- (changelog.lua is put in front of this script.)
-- KEYS: 1 guard key (a string with an expiry: this token was applied), 2 state log hash,
--       3 changes zset, 4 backlog hash, 5 queued hash, 6 forming hash, 7 pending hash,
--       8 pending-queued hash
-- ARGV: 1 guard expiry (s), 2 epoch candidate, 3 change-log size, then for each change
--       its counter's change-log letter ('b', 'q', 'i', 'p' or 'r': keys.COUNTERS, which
--       also orders KEYS 4-8), its member and its amount
-- Every key is in the cluster state's hash slot. Returns 1 when applied, 0 when the
-- token was applied before (nothing is done then).
if not redis.call('SET', KEYS[1], '1', 'NX', 'EX', tonumber(ARGV[1])) then return 0 end
local hashes = {b = KEYS[4], q = KEYS[5], i = KEYS[6], p = KEYS[7], r = KEYS[8]}
for i = 4, #ARGV, 3 do
  local letter, member, amount = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
  local hash = hashes[letter]
  if amount ~= 0 and hash then
    local v = (tonumber(redis.call('HGET', hash, member) or '0') or 0) + amount
    redis.call('HSET', hash, member, tostring(v))
    log_change(KEYS[2], KEYS[3], ARGV[2], ARGV[3], letter .. ':' .. member)
  end
end
return 1

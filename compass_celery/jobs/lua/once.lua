-- Add ms to per-worker counters once per token, and log the changes for readers: a
-- submission's retry after a lost reply must not count its work twice.
-- (changelog.lua is put in front of this script.)
-- KEYS: 1 guard key (a string with an expiry: this token was applied), 2 counter hash
--       (backlog or pending), 3 state log hash, 4 changes zset
-- ARGV: 1 guard expiry (s), 2 change-log member kind ('b' or 'p'), 3 epoch candidate,
--       4 change-log size, then worker name and ms for each change
-- Every key is in the cluster state's hash slot. Returns 1 when applied, 0 when the
-- token was applied before (nothing is done then).
if not redis.call('SET', KEYS[1], '1', 'NX', 'EX', tonumber(ARGV[1])) then return 0 end
for i = 5, #ARGV, 2 do
  local worker, ms = ARGV[i], tonumber(ARGV[i + 1])
  if ms ~= 0 then
    local v = (tonumber(redis.call('HGET', KEYS[2], worker) or '0') or 0) + ms
    redis.call('HSET', KEYS[2], worker, tostring(v))
    log_change(KEYS[3], KEYS[4], ARGV[3], ARGV[4], ARGV[2] .. ':' .. worker)
  end
end
return 1

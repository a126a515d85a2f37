-- Write one learned value (a task's run time, a class's plan error) only if it is still
-- the value the writer computed it from, and log the change for readers: the atomic half
-- of a read-modify-write whose rule is Python's alone (state/records.py: next_profile,
-- next_plan_error); on a mismatch the writer computes again from the value returned.
-- (changelog.lua is put in front of this script.)
-- KEYS: 1 the learned values' hash, 2 state log hash, 3 changes zset
-- ARGV: 1 field, 2 the value the writer started from ('' for none), 3 the new value,
--       4 change-log member, 5 epoch candidate, 6 change-log size
-- Returns {1} when written, {0, current value or false} when the field had changed.
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if (cur or '') ~= ARGV[2] then return {0, cur or false} end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
log_change(KEYS[2], KEYS[3], ARGV[5], ARGV[6], ARGV[4])
return {1}

-- Fail a running job once: record the error and wake its waiters.
-- KEYS: 1 job hash, 2 done list; ARGV: 1 error JSON, 2 ttl seconds
-- Returns the job's state after the call ('FAILURE', or the terminal state it had).
local state = redis.call('HGET', KEYS[1], 'state')
if not state then return 'missing' end
if state ~= 'RUNNING' then return state end
redis.call('HSET', KEYS[1], 'state', 'FAILURE', 'error', ARGV[1])
redis.call('RPUSH', KEYS[2], 'FAILURE')
redis.call('EXPIRE', KEYS[2], tonumber(ARGV[2]))
return 'FAILURE'

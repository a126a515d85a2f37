-- Record one node's output and release its successors, exactly once.
-- KEYS: 1 job hash, 2 outputs hash, 3 pending-pred counts hash, 4 done list,
--       5 run-info hash, 6 sent task ids hash
-- ARGV: 1 node, 2 output JSON, 3 ttl seconds, 4 run-info JSON, 5.. successors
-- Returns {'ok', ready...} | {'finished'} | {'duplicate', unsent...} | {'late', state} |
-- {'missing'}. A duplicate (a redelivery, or a retry after a client timeout when the first
-- call did run) returns the successors this node released that were never confirmed sent
-- (no task id in the sent hash, or only a claim '?<id>' whose publish never confirmed), so
-- a completion interrupted before or while sending them resumes.
local state = redis.call('HGET', KEYS[1], 'state')
if not state then return {'missing'} end
if redis.call('HSETNX', KEYS[2], ARGV[1], ARGV[2]) == 0 then
  local unsent = {'duplicate'}
  if state == 'RUNNING' then
    for i = 5, #ARGV do
      local left = tonumber(redis.call('HGET', KEYS[3], ARGV[i]) or '1')
      local sent = redis.call('HGET', KEYS[6], ARGV[i])
      if left <= 0 and (not sent or string.sub(sent, 1, 1) == '?') then
        table.insert(unsent, ARGV[i])
      end
    end
  end
  return unsent
end
redis.call('HSET', KEYS[5], ARGV[1], ARGV[4])
local ndone = redis.call('HINCRBY', KEYS[1], 'ndone', 1)
for i = 1, #KEYS do redis.call('EXPIRE', KEYS[i], tonumber(ARGV[3])) end
if state ~= 'RUNNING' then return {'late', state} end
local ready = {'ok'}
for i = 5, #ARGV do
  if redis.call('HINCRBY', KEYS[3], ARGV[i], -1) == 0 then table.insert(ready, ARGV[i]) end
end
if ndone >= tonumber(redis.call('HGET', KEYS[1], 'total')) then
  redis.call('HSET', KEYS[1], 'state', 'SUCCESS')
  redis.call('RPUSH', KEYS[4], 'SUCCESS')
  redis.call('EXPIRE', KEYS[4], tonumber(ARGV[3]))
  return {'finished'}
end
return ready

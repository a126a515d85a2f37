-- Record one node's output and release (and claim) its successors, exactly once, in one step.
-- KEYS: 1 job hash, 2 outputs hash, 3 pending-pred counts hash, 4 done list,
--       5 run-info hash, 6 sent task ids hash
-- ARGV: 1 node, 2 output JSON, 3 ttl seconds, 4 run-info JSON, 5 now (unix s), 6 job id
-- The job hash holds each node's spec under 'n:<node>' and its plan under 'p:<node>', so a
-- completion reads only its own node and the successors it releases, never the whole DAG.
-- Returns {'ok', released...} | {'finished'} | {'duplicate', released...} | {'late', state}
-- | {'expired'} | {'missing'}, where each released successor is five items: name, task id,
-- spec JSON, plan JSON ('' when unplanned), input locations JSON {worker: output KB}.
-- A released successor is claimed as '?<task id>' in the sent hash; the caller confirms it
-- once published. A duplicate completion (a redelivery, or a retry after a client timeout
-- when the first call did run) returns the successors released but never confirmed, with
-- the task id of their claim, so an interrupted completion resumes under the same ids.
local job = KEYS[1]
local head = redis.call('HMGET', job, 'state', 'deadline', 'n:' .. ARGV[1])
local state, spec = head[1], head[3]
if not state or not spec then return {'missing'} end
if state == 'RUNNING' and tonumber(head[2]) < tonumber(ARGV[5]) then return {'expired'} end
local succs = cjson.decode(spec)['succs']

local function release(out, s, id)
  local sspec = redis.call('HGET', job, 'n:' .. s)
  local where = {}
  for _, p in ipairs(cjson.decode(sspec)['preds']) do
    local info = redis.call('HGET', KEYS[5], p)
    local worker = info and cjson.decode(info)['worker'] or cjson.decode(ARGV[4])['worker']
    local kb = tonumber(cjson.decode(redis.call('HGET', job, 'n:' .. p))['output_kb']) or 0
    where[worker] = (where[worker] or 0) + kb
  end
  table.insert(out, s)
  table.insert(out, id)
  table.insert(out, sspec)
  table.insert(out, redis.call('HGET', job, 'p:' .. s) or '')
  table.insert(out, cjson.encode(where))
end

if redis.call('HSETNX', KEYS[2], ARGV[1], ARGV[2]) == 0 then
  local out = {'duplicate'}
  if state == 'RUNNING' then
    for _, s in ipairs(succs) do
      local left = tonumber(redis.call('HGET', KEYS[3], s) or '1')
      local sent = redis.call('HGET', KEYS[6], s)
      if left <= 0 and (not sent or string.sub(sent, 1, 1) == '?') then
        local id = ARGV[6] .. '.' .. s
        if sent then id = string.sub(sent, 2) else redis.call('HSET', KEYS[6], s, '?' .. id) end
        release(out, s, id)
      end
    end
  end
  return out
end
redis.call('HSET', KEYS[5], ARGV[1], ARGV[4])
local ndone = redis.call('HINCRBY', job, 'ndone', 1)
for i = 1, #KEYS do redis.call('EXPIRE', KEYS[i], tonumber(ARGV[3])) end
if state ~= 'RUNNING' then return {'late', state} end
local out = {'ok'}
for _, s in ipairs(succs) do
  if redis.call('HINCRBY', KEYS[3], s, -1) == 0 then
    local id = ARGV[6] .. '.' .. s
    if redis.call('HSETNX', KEYS[6], s, '?' .. id) == 1 then release(out, s, id) end
  end
end
if ndone >= tonumber(redis.call('HGET', job, 'total')) then
  redis.call('HSET', job, 'state', 'SUCCESS')
  redis.call('RPUSH', KEYS[4], 'SUCCESS')
  redis.call('EXPIRE', KEYS[4], tonumber(ARGV[3]))
  return {'finished'}
end
return out

-- kombu's push of one message onto a compass queue and a token on the queue's bell, in one
-- step (one EVALSHA, where a MULTI/EXEC of the same commands cost twice a plain push).
-- A job's later step (ARGV[4] given) joins its priority list ahead of the first steps
-- waiting there, behind the later steps already waiting (``worker.core.LevelQueue``, the
-- one rule: the simulator runs it there). A consumer RPOPs, so the list's right end is its
-- front: from there, skip the later steps and insert the message just to the right of the
-- first entry that is not one; with none found within ARGV[5] entries, LPUSH it, as kombu
-- would (urgent lists are short).
-- KEYS: 1 the list kombu pushes it to (its _q_for_pri), 2 the queue's bell,
--       3.. the queue's lists kombu gives an expiry (a queue with x-expires)
-- ARGV: 1 the message, 2 the bell's expiry (ms), 3 the lists' expiry (ms, or ''),
--       4 (a later step only) the job header's name, 5 how many entries to read at most
-- Returns 1.
local function later(raw)
  local ok, msg = pcall(cjson.decode, raw)
  local headers = ok and type(msg) == 'table' and msg.headers
  local job = type(headers) == 'table' and headers[ARGV[4]]
  return type(job) == 'table' and job.later == true
end

local pushed = false
if ARGV[4] and ARGV[4] ~= '' then
  local limit = math.min(redis.call('LLEN', KEYS[1]), tonumber(ARGV[5]))
  for i = 1, limit do
    local raw = redis.call('LINDEX', KEYS[1], -i)
    if not later(raw) then
      redis.call('LINSERT', KEYS[1], 'AFTER', raw, ARGV[1])
      pushed = true
      break
    end
  end
end
if not pushed then redis.call('LPUSH', KEYS[1], ARGV[1]) end
for k = 3, #KEYS do redis.call('PEXPIRE', KEYS[k], ARGV[3]) end
redis.call('LPUSH', KEYS[2], '1')  -- wakes the queue's idle consumer
redis.call('PEXPIRE', KEYS[2], ARGV[2])
return 1

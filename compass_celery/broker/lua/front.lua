-- Push a job's later step onto a priority list ahead of the first steps waiting there,
-- behind the later steps already waiting (``worker.core.LevelQueue``, the one rule:
-- the simulator runs it there). A consumer RPOPs, so the list's right end is its front:
-- from there, skip the later steps, and insert the message just to the right of the
-- first entry that is not one; with none found, LPUSH it (behind them all), as kombu
-- would. Only the first ARGV[3] entries from the front are read (urgent lists are short;
-- past that it falls back to the LPUSH).
-- KEYS: 1 the priority list
-- ARGV: 1 the raw message, 2 the job header's name (a later step's carries later=true),
--       3 how many entries to read at most
-- Returns the list's length after the push.
local n = redis.call('LLEN', KEYS[1])
local limit = math.min(n, tonumber(ARGV[3]))
for i = 1, limit do
  local raw = redis.call('LINDEX', KEYS[1], -i)
  local ok, msg = pcall(cjson.decode, raw)
  local headers = ok and type(msg) == 'table' and msg.headers
  local job = type(headers) == 'table' and headers[ARGV[2]]
  if not (type(job) == 'table' and job.later == true) then
    return redis.call('LINSERT', KEYS[1], 'AFTER', raw, ARGV[1])
  end
end
return redis.call('LPUSH', KEYS[1], ARGV[1])

-- Learned run time: fold one measured run into a task profile's EWMA.
-- KEYS[1] profiles hash; ARGV[1] field; ARGV[2] measured ms; ARGV[3] alpha
-- With ARGV[4] = 'quantile': ARGV[2] is an observation and ARGV[3] the quantile tau;
-- the field tracks that quantile in steps of ARGV[5] ms (planner.admission's
-- plan_error_step, the same rule).
local cur = redis.call('HGET', KEYS[1], ARGV[1])
local ms = tonumber(ARGV[2])
local alpha = tonumber(ARGV[3])
local n = 1
if ARGV[4] == 'quantile' then
  local q = 0
  if cur then
    local ok, prof = pcall(cjson.decode, cur)
    if ok and type(prof) == 'table' and tonumber(prof['exec_ms']) then
      q = tonumber(prof['exec_ms'])
      n = (tonumber(prof['n']) or 0) + 1
    end
  end
  local step = tonumber(ARGV[5])
  if ms > q then q = q + step * alpha else q = q + step * (alpha - 1) end
  redis.call('HSET', KEYS[1], ARGV[1], cjson.encode({exec_ms = q, n = n}))
  return tostring(q)
end
if cur then
  local ok, prof = pcall(cjson.decode, cur)
  if ok and type(prof) == 'table' and tonumber(prof['exec_ms']) and tonumber(prof['n']) then
    local old = tonumber(prof['exec_ms'])
    n = tonumber(prof['n']) + 1
    -- a run more than 3x off the average resets it (dask's outlier rule, widened)
    if ms <= old * 3 and ms * 3 >= old then
      ms = old + alpha * (ms - old)
    end
  end
end
redis.call('HSET', KEYS[1], ARGV[1], cjson.encode({exec_ms = ms, n = n}))
return tostring(ms)

-- Publish a worker's record and its heartbeat on Redis's own clock.
-- (changelog.lua is put in front of this script.)
-- KEYS: 1 workers hash, 2 beats zset, 3 state log hash, 4 changes zset, 5 worker-stats hash
-- ARGV: 1 worker name, 2 record JSON, 3 epoch candidate, 4 change-log size, 5 the worker's
--       informational counters as JSON ('' for none): kept beside the record, never logged,
--       so a counter that moves on every task does not make readers fetch the record again
-- Returns Redis TIME (seconds) of the beat. Liveness is judged from these beats and
-- Redis TIME alone, never by comparing two hosts' clocks. The record is written and
-- logged only when its bytes changed or the worker had no beat: an idle worker
-- publishes the same bytes every time, and readers then have nothing to fetch.
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local old = redis.call('HGET', KEYS[1], ARGV[1])
local new_beat = redis.call('ZADD', KEYS[2], now, ARGV[1])
if old ~= ARGV[2] then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
end
if ARGV[5] ~= '' then
  redis.call('HSET', KEYS[5], ARGV[1], ARGV[5])
end
if old ~= ARGV[2] or new_beat == 1 then
  log_change(KEYS[3], KEYS[4], ARGV[3], ARGV[4], 'w:' .. ARGV[1])
end
return tostring(now)

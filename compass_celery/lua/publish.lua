-- Publish a worker's record and its heartbeat on Redis's own clock.
-- KEYS: 1 workers hash, 2 beats zset; ARGV: 1 worker name, 2 record JSON
-- Returns Redis TIME (seconds) of the beat. Liveness is judged from these beats and
-- Redis TIME alone, never by comparing two hosts' clocks.
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[2], now, ARGV[1])
return tostring(now)

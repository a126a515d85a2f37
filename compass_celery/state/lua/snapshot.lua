-- What changed in the cluster state since a reader's last read, in one round trip.
-- KEYS: 1 state log hash, 2 changes zset, 3 workers hash, 4 beats zset, 5 backlog hash,
--       6 pending hash, 7 profiles hash, 8 queued hash, 9 forming hash, 10 plan-errors
--       hash, 11 pending-queued hash, 12 planned-loads zset
-- ARGV: 1 the reader's epoch ('' for none), 2 its version (-1: read everything),
--       3 heartbeat timeout (s), 4 a ZSCAN cursor over the beats ('' for none: the
--       reader refreshes the beats it reports a slice at a time, now and then),
--       5 the reader's own writes: 'member<TAB>version' lines of counter changes this
--       reader made itself and already knows the value of (counters.lua returned it); a
--       member whose latest change is still that version is left out of a delta
-- Returns {epoch or false, version, Redis TIME, kind, number of records, stale beats,
--          beats, body, planned loads}; beats is {next cursor, flat name/score list} or
--          false; planned loads are the flat member/end pairs of the loads producers
--          planned that are not over on Redis's clock (not in the change log: read whole,
--          they are few):
--   kind 'full'  (new reader, other epoch, version went back or fell off the log):
--                body = {records, backlog, pending, profiles, queued, forming,
--                plan errors, pending-queued}, each a
--                flat field/value
--                list, and beats is every beat with cursor '0';
--   kind 'delta' body = flat {member, value or false, beat or false} per changed member
--                (the beat only for 'w:' members);
--   kind 'same'  body = {}.
-- Stale beats are name/score pairs of beats older than the timeout on Redis's clock:
-- liveness stays exact on every read without reading every worker's beat.
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local log = redis.call('HMGET', KEYS[1], 'version', 'epoch', 'floor')
local version = tonumber(log[1]) or 0
local floor = tonumber(log[3]) or 0
local mine = tonumber(ARGV[2])
local kind = 'delta'
if mine < 0 or (log[2] or '') ~= ARGV[1] or version < mine or mine < floor then
  kind = 'full'
elseif version == mine then
  kind = 'same'
end
local body = {}
if kind == 'full' then
  body = {redis.call('HGETALL', KEYS[3]), redis.call('HGETALL', KEYS[5]),
          redis.call('HGETALL', KEYS[6]), redis.call('HGETALL', KEYS[7]),
          redis.call('HGETALL', KEYS[8]), redis.call('HGETALL', KEYS[9]),
          redis.call('HGETALL', KEYS[10]), redis.call('HGETALL', KEYS[11])}
elseif kind == 'delta' then
  local hashes = {w = KEYS[3], b = KEYS[5], p = KEYS[6], f = KEYS[7], q = KEYS[8],
                  i = KEYS[9], e = KEYS[10], r = KEYS[11]}
  local own = {}
  for member, at in string.gmatch(ARGV[5] or '', '([^\n]+)\t(%d+)') do
    own[member] = at
  end
  local changed = redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. mine, '+inf', 'WITHSCORES')
  for i = 1, #changed, 2 do
    local member = changed[i]
    local prefix, name = string.sub(member, 1, 1), string.sub(member, 3)
    local hash = hashes[prefix]
    if hash and own[member] ~= changed[i + 1] then
      body[#body + 1] = member
      body[#body + 1] = redis.call('HGET', hash, name)
      body[#body + 1] = prefix == 'w' and redis.call('ZSCORE', KEYS[4], name) or false
    end
  end
end
local beats = false
if kind == 'full' then
  beats = {'0', redis.call('ZRANGE', KEYS[4], 0, -1, 'WITHSCORES')}
elseif ARGV[4] ~= '' then
  beats = redis.call('ZSCAN', KEYS[4], ARGV[4], 'COUNT', 128)
end
local stale = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf',
                         '(' .. string.format('%.6f', now - tonumber(ARGV[3])), 'WITHSCORES')
local planned = redis.call('ZRANGEBYSCORE', KEYS[12], string.format('%.6f', now), '+inf',
                          'WITHSCORES')
return {log[2], version, tostring(now), kind, redis.call('HLEN', KEYS[3]), stale, beats, body,
        planned}

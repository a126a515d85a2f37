-- Take a worker's next message the way kombu's BRPOP would, but out of its list and into
-- kombu's unacked hash and index, with a compass lease, in one atomic step: a message is
-- always in a list or in flight, where recovery finds it, even if its worker dies between
-- Redis's reply and its own bookkeeping (kombu's BRPOP left that window open).
-- KEYS: 1 kombu's unacked hash, 2 kombu's unacked_index zset, 3 compass leases zset,
--       4 .. 3+n the lists it consumes, in kombu's BRPOP order, then its queues' bells,
--       then (a held slot only) the state's pending-queued hash, the worker's hold key
--       and its own queue's bell
-- ARGV: 1 the host's time (kombu compares its index with host clocks), 2 n (the lists),
--       3 the job header's name ('' reads no job state), 4 and 5 what goes before and
--       after a job's id in its record's key (the state lives in this Redis),
--       6 a, the count of acks, 7 .. 6+a the delivery tags the worker acks (h = 6+a);
--       a held slot only: h+1 the bells' count, h+2 the bound (real ms), h+3 the worker's
--       pending-queued member prefix ('<worker>\x1f'), h+4 the planned ms that count as
--       none (planner.priority.PLANNED_EPS_MS), h+5 the highest level
--       (planner.priority.HIGHEST), h+6 .. h+5+n each list's highest level
-- (inflight.lua is put in front of this script.)
-- The acks come first: kombu's own ack of each tag (its unacked entry and index score)
-- and its compass lease, as its worker's previous task ended; the look that follows
-- then costs the worker no round trip of its own (broker.fetch defers the ack to it).
-- Returns {list, raw message} (and, for a job node when ARGV 3 names the header, its
-- job's state, '' once its record is gone: the worker's receipt check asks Redis nothing);
-- nil when every list is empty, and then the bells are
-- cleared: their tokens were rung for messages already taken, and the worker blocks on
-- them next. An entry that is not a kombu message is returned unrecorded: the
-- consumer's guard dead-letters it.
-- The held slot (worker.core.slot_held_until, the same rule): while a level above a
-- waiting list's is planned on this worker (its pending-queued members > 0), that list's
-- message is not taken, for at most the bound from when the hold began (kept in the hold
-- key); returns {'\0held', ms left} and clears its own queue's bell (its tokens were rung
-- for messages it holds; a push rings anew: the successor arriving wakes the worker, as
-- does its BRPOP timeout at the bound). The shared queue's bell is left to its other
-- consumers, which may take what this worker holds. Only work without a deadline is
-- held: a held list's next message whose compass header carries a due time (its job
-- has a deadline: Decision.due > 0) is taken as ever, the hold ending with it.
local function has_due(raw)
  local ok, msg = pcall(cjson.decode, raw)
  local headers = ok and type(msg) == 'table' and msg.headers
  local compass = type(headers) == 'table' and headers.compass
  local due = type(compass) == 'table' and tonumber(compass.due)
  return type(due) == 'number' and due > 0
end
local h = 6 + tonumber(ARGV[6])
for i = 7, h do
  redis.call('ZREM', KEYS[2], ARGV[i])
  redis.call('HDEL', KEYS[1], ARGV[i])
  redis.call('ZREM', KEYS[3], ARGV[i])
end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local last = 3 + tonumber(ARGV[2])
local bells = #KEYS
local top, since, left = -1, nil, 0
local bound = tonumber(ARGV[h + 2] or '0') or 0
local hold_key = nil
if bound > 0 then
  bells = last + tonumber(ARGV[h + 1])
  local planned = KEYS[bells + 1]
  hold_key = KEYS[bells + 2]
  local eps = tonumber(ARGV[h + 4])
  for level = tonumber(ARGV[h + 5]), 1, -1 do
    local ms = tonumber(redis.call('HGET', planned, ARGV[h + 3] .. level) or '0') or 0
    if ms > eps then top = level break end
  end
  if top < 0 then
    redis.call('DEL', hold_key)
  else
    since = tonumber(redis.call('GET', hold_key) or '') or now
    left = since * 1000 + bound - now * 1000
  end
end
for k = 4, last do
  local head = top >= 0 and left > 0 and tonumber(ARGV[h + 2 + k]) < top
    and redis.call('LINDEX', KEYS[k], -1)
  if head and not has_due(head) then
    redis.call('SET', hold_key, string.format('%.6f', since), 'PX', math.ceil(left) + 1000)
    redis.call('DEL', KEYS[bells + 3])
    return {'\0held', tostring(left)}
  end
  local raw = redis.call('RPOP', KEYS[k])
  if raw then
    if hold_key then redis.call('DEL', hold_key) end
    local ok, msg = pcall(cjson.decode, raw)
    local props = ok and type(msg) == 'table' and msg.properties
    local tag = type(props) == 'table' and props.delivery_tag
    if type(tag) == 'string' then
      in_flight(KEYS[1], KEYS[2], KEYS[3], raw, props, tonumber(ARGV[1]), now)
    end
    local headers = ok and type(msg) == 'table' and msg.headers
    local job = ARGV[3] ~= '' and type(headers) == 'table' and headers[ARGV[3]]
    if type(job) == 'table' and type(job.id) == 'string' then
      return {KEYS[k], raw, redis.call('HGET', ARGV[4] .. job.id .. ARGV[5], 'state') or ''}
    end
    return {KEYS[k], raw}
  end
end
if hold_key then redis.call('DEL', hold_key) end
for k = last + 1, bells do redis.call('DEL', KEYS[k]) end
return false

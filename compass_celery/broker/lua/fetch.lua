-- Take a worker's next message the way kombu's BRPOP would, but out of its list and into
-- kombu's unacked hash and index, with a compass lease, in one atomic step: a message is
-- always in a list or in flight, where recovery finds it, even if its worker dies between
-- Redis's reply and its own bookkeeping (kombu's BRPOP left that window open).
-- KEYS: 1 kombu's unacked hash, 2 kombu's unacked_index zset, 3 compass leases zset,
--       4 .. 3+n the lists it consumes, in kombu's BRPOP order, then its queues' bells
-- ARGV: 1 the host's time (kombu compares its index with host clocks), 2 n (the lists)
-- (inflight.lua is put in front of this script.)
-- Returns {list, raw message}; nil when every list is empty, and then the bells are
-- cleared: their tokens were rung for messages already taken, and the worker blocks on
-- them next. An entry that is not a kombu message is returned unrecorded: the
-- consumer's guard dead-letters it.
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local last = 3 + tonumber(ARGV[2])
for k = 4, last do
  local raw = redis.call('RPOP', KEYS[k])
  if raw then
    local ok, msg = pcall(cjson.decode, raw)
    local props = ok and type(msg) == 'table' and msg.properties
    local tag = type(props) == 'table' and props.delivery_tag
    if type(tag) == 'string' then
      in_flight(KEYS[1], KEYS[2], KEYS[3], raw, props, tonumber(ARGV[1]), now)
    end
    return {KEYS[k], raw}
  end
end
for k = last + 1, #KEYS do redis.call('DEL', KEYS[k]) end
return false

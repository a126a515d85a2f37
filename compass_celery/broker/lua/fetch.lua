-- Take a worker's next message the way kombu's BRPOP would, but out of its list and into
-- kombu's unacked hash and index, with a compass lease, in one atomic step: a message is
-- always in a list or in flight, where recovery finds it, even if its worker dies between
-- Redis's reply and its own bookkeeping (kombu's BRPOP left that window open).
-- KEYS: 1 kombu's unacked hash, 2 kombu's unacked_index zset, 3 compass leases zset,
--       4 the worker's fetch list (what its blocking wait moved there: taken first),
--       5.. the lists it consumes, in kombu's BRPOP order
-- ARGV: 1 the host's time (kombu compares its index with host clocks)
-- (inflight.lua is put in front of this script.)
-- Returns {list, raw message} or nil when every list is empty. An entry that is not a
-- kombu message is returned unrecorded: the consumer's guard dead-letters it.
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
for k = 4, #KEYS do
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
return false

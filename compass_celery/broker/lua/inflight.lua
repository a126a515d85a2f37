-- Put one message in flight as kombu's consumer would, with a compass lease: kombu's
-- unacked entry ([message, exchange, routing_key], the message kept byte for byte) and its
-- index score (the host's time, which kombu compares with host clocks), and the lease at
-- Redis's time. Put in front of fetch.lua and claim.lua, which both take messages so.
local function in_flight(unacked, index, leases, raw, props, host_now, now)
  local info = type(props.delivery_info) == 'table' and props.delivery_info or {}
  local entry = '[' .. raw .. ',' .. cjson.encode(info.exchange or '') .. ','
                .. cjson.encode(info.routing_key or '') .. ']'
  redis.call('HSET', unacked, props.delivery_tag, entry)
  redis.call('ZADD', index, host_now, props.delivery_tag)
  redis.call('ZADD', leases, now, props.delivery_tag)
end

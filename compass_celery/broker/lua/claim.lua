-- Claim up to N waiting messages of one task (and model) from a worker's own queue, as
-- kombu's consumer takes one: out of its list, into kombu's unacked hash and index,
-- with a compass lease, in one atomic step. A batched task's worker runs them as one
-- forward pass; a crash after this leaves them in flight, where recovery finds them.
-- KEYS: 1 kombu's unacked hash, 2 kombu's unacked_index zset, 3 compass leases zset,
--       4.. the queue's lists in the order kombu consumes them
-- ARGV: 1 task name, 2 model ('' for any), 3 how many at most, 4 the host's time (kombu
--       compares its index with host clocks), 5 how many messages to look at per list
-- (inflight.lua is put in front of this script.)
-- Returns the claimed raw messages, oldest first.
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local want, scan = tonumber(ARGV[3]), tonumber(ARGV[5])
local out = {}
for k = 4, #KEYS do
  if #out >= want then break end
  local items = redis.call('LRANGE', KEYS[k], -scan, -1)
  for i = #items, 1, -1 do  -- a list's next message is its right end
    if #out >= want then break end
    local raw = items[i]
    local ok, msg = pcall(cjson.decode, raw)
    if ok and type(msg) == 'table' and type(msg.headers) == 'table'
        and msg.headers.task == ARGV[1] then
      local placed = msg.headers.compass
      local model = (type(placed) == 'table' and type(placed.model) == 'string'
                     and placed.model) or ''
      local props = msg.properties
      local tag = type(props) == 'table' and props.delivery_tag
      if (ARGV[2] == '' or model == ARGV[2]) and type(tag) == 'string'
          and redis.call('LREM', KEYS[k], -1, raw) == 1 then
        in_flight(KEYS[1], KEYS[2], KEYS[3], raw, props, tonumber(ARGV[4]), now)
        table.insert(out, raw)
      end
    end
  end
end
return out

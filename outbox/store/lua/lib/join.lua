-- A message joins its ordering key (lib/ordering.lua describes the key's queue and
-- state): on its own so that create.lua, which needs nothing else of ordering.lua, does
-- not define the rest on every call (each function a script defines costs its every
-- call, about 0.1 us; create is send()'s one script). Needs nothing included before it.

-- Message `id` joins the tail of its key (queue `q`, state `st`: known keys) at `now`
-- (seconds): returns whether it is the head (nothing ahead of it), its sequence number,
-- the sequence of the last message delivered (nil: none) and the key's epoch (created
-- with the state: a state that expired restarts at 1 in a new epoch).
local function order_join(q, st, id, now)
  local ahead = redis.call('ZCARD', q)
  local cur = redis.call('HMGET', st, 'last', 'epoch')
  local last, epoch = cur[1], cur[2]
  local seq = redis.call('HINCRBY', st, 'seq', 1)
  if not epoch then
    epoch = string.format('%d-%s', math.floor(tonumber(now) * 1000), id)
    redis.call('HSET', st, 'epoch', epoch)
  end
  redis.call('PERSIST', st)
  redis.call('ZADD', q, seq, id)
  return ahead == 0, seq, last, epoch
end

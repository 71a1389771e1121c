-- Give claimed messages back without charging an attempt: sending -> pending (no
-- retries yet) or retrying, due now, back in their queue's due index, which is woken.
-- Only messages still held under the given lease are released.
--
-- ARGV[1] prefix  ARGV[2] now (epoch seconds)  ARGV[3] lease token
-- ARGV[4] lease deadline: when no ids follow, every id in a sending index (of any
--         destination) with this exact score is a candidate (a claim whose reply was lost)
-- ARGV[5] wake flag TTL (ms)  ARGV[6..] ids (optional)
-- Returns {ids released, queues whose wake-up flag this call set}.
-- Index writes are made once per index for the whole call (lib/writes.lua, lib/move.lua).
--! include writes
--! include move
--! include wakeup
local prefix, now_s, lease, deadline, wake_ttl = ARGV[1], ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5])
local ids = {}
if #ARGV > 5 then
  for i = 6, #ARGV do ids[#ids + 1] = ARGV[i] end
else
  for _, dest in ipairs(redis.call('SMEMBERS', prefix .. ':destinations')) do
    for _, id in ipairs(redis.call('ZRANGEBYSCORE', prefix .. ':status:sending:dest:' .. dest, deadline, deadline)) do
      ids[#ids + 1] = id
    end
  end
end
local released = {}
for _, id in ipairs(ids) do
  local rkey = prefix .. ':resend:' .. id
  local cur = redis.call('HMGET', rkey, 'status', 'destination', 'queue', 'lease', 'retry_count')
  if cur[1] == 'sending' and cur[4] == lease then
    local dest, queue = cur[2], cur[3] or ''
    local to = 'pending'
    if tonumber(cur[5] or '0') > 0 then to = 'retrying' end
    move_indexes(prefix, id, dest, queue, 'sending', to, now_s, false)
    redis.call('HSET', rkey, 'status', to, 'next_attempt_at', now_s, 'updated_at', now_s)
    redis.call('HDEL', rkey, 'lease')
    released[#released + 1] = id
    wake_queue(prefix, queue, now_s, wake_ttl)
  end
end
flush_writes()
return {released, woken}

-- Claim due messages of one queue for delivery: pending|retrying -> sending, with a
-- lease (the visibility timeout), in due order. This compare-and-set is the lock: a
-- message is claimed by one worker at a time.
--
-- ARGV[1] prefix        ARGV[2] now (epoch seconds, string)
-- ARGV[3] queue         ARGV[4] lease token
-- ARGV[5] lease deadline (epoch seconds; the message's score in the sending index)
-- ARGV[6] most messages to claim
-- ARGV[7] most due index entries to look at (claims may skip some, see ARGV[8])
-- ARGV[8] JSON object destination -> most messages of it this call may claim
--         (a destination at its cap is skipped, its messages stay due); "{}" = no caps
-- ARGV[9] due slack (seconds): messages due by now + slack are taken
-- Returns {claimed, next_due}: claimed is a flat list of message HGETALL, resend
-- HGETALL per claimed message; next_due is the score of the earliest entry left in the
-- due index (a string), or false when it is empty.
local prefix, now_s, queue, lease, deadline = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local limit, scan = tonumber(ARGV[6]), tonumber(ARGV[7])
local caps = cjson.decode(ARGV[8])
local due_key = prefix .. ':due:' .. queue
local out = {}
local taken = 0
if limit > 0 then
  local ids = redis.call('ZRANGEBYSCORE', due_key, '-inf', tonumber(now_s) + tonumber(ARGV[9]), 'LIMIT', 0, scan)
  for _, id in ipairs(ids) do
    if taken >= limit then break end
    local rkey = prefix .. ':resend:' .. id
    local cur = redis.call('HMGET', rkey, 'status', 'destination')
    local status, dest = cur[1], cur[2]
    if status == 'pending' or status == 'retrying' then
      local cap = caps[dest]
      if cap == nil or cap > 0 then
        if cap ~= nil then caps[dest] = cap - 1 end
        redis.call('ZREM', due_key, id)
        redis.call('ZREM', prefix .. ':status:' .. status, id)
        redis.call('ZREM', prefix .. ':status:' .. status .. ':dest:' .. dest, id)
        redis.call('ZADD', prefix .. ':status:sending', deadline, id)
        redis.call('ZADD', prefix .. ':status:sending:dest:' .. dest, deadline, id)
        redis.call('HSET', rkey, 'status', 'sending', 'lease', lease, 'last_attempt_at', now_s, 'updated_at', now_s)
        out[#out + 1] = redis.call('HGETALL', prefix .. ':message:' .. id)
        out[#out + 1] = redis.call('HGETALL', rkey)
        taken = taken + 1
      end
    else
      -- A stale entry (the message moved on or was deleted): repair the index.
      redis.call('ZREM', due_key, id)
    end
  end
end
local first = redis.call('ZRANGE', due_key, 0, 0, 'WITHSCORES')
local next_due = false
if first[2] then next_due = first[2] end
return {out, next_due}

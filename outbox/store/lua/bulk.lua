-- One status change applied to many messages (a user's bulk requeue or cancel):
-- the same compare-and-set as transition.lua, without per-message JSON, and with one
-- Pub/Sub event per call listing the ids acted on.
--
-- ARGV[1] prefix            ARGV[2] now (epoch seconds, string)
-- ARGV[3] Pub/Sub channel ("" = publish nothing)
-- ARGV[4] action name for the event ("requeued" -> "messages.requeued")
-- ARGV[5] status after      ARGV[6] comma-separated statuses it may come from
-- ARGV[7] number of fields to set N, then N field/value pairs
-- then: comma-separated fields to delete ("" = none),
--       first index score, score step between messages (distinct scores, no ties),
--       wake flag TTL (ms), number of groups G, then per group: job id ("" = none;
--       else written as job_id), number of ids, the ids.
-- Index writes are made once per index for the whole call (lib/writes.lua).
-- Returns {per id in order: 1 changed, 0 skipped (other status, or no such message),
--          queues whose wake-up flag this call set (when messages became due)}.
--! include writes
--! include move
--! include wakeup
local prefix, now_s, channel, action, to = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local allowed = {}
for s in string.gmatch(ARGV[6], '[^,]+') do allowed[s] = true end
local nset = tonumber(ARGV[7])
local pos = 8
local fields = {'status', to, 'updated_at', now_s}
for _ = 1, nset do
  fields[#fields + 1] = ARGV[pos]
  fields[#fields + 1] = ARGV[pos + 1]
  pos = pos + 2
end
local unset = {}
for f in string.gmatch(ARGV[pos], '[^,]+') do unset[#unset + 1] = f end
-- Scores are counted in whole microseconds (exact in a double up to 2^53) and written
-- as "seconds.micros", so successive messages get distinct scores: formatting a float
-- sum with %.6f can round two neighbours to the same text. The first score is rounded
-- (not floored) to micros so that a caller counting in whole micros gets its number back.
local base_us = math.floor(tonumber(ARGV[pos + 1]) * 1e6 + 0.5)
local step_us = math.max(1, math.floor(tonumber(ARGV[pos + 2]) * 1e6 + 0.5))
local wake_ttl = tonumber(ARGV[pos + 3])
local ngroups = tonumber(ARGV[pos + 4])
pos = pos + 5
local out, acted, k = {}, {}, 0
for _ = 1, ngroups do
  local job, n = ARGV[pos], tonumber(ARGV[pos + 1])
  pos = pos + 2
  for _ = 1, n do
    local id = ARGV[pos]
    pos = pos + 1
    k = k + 1
    local rkey = prefix .. ':resend:' .. id
    local cur = redis.call('HMGET', rkey, 'status', 'destination', 'queue')
    local status, dest = cur[1], cur[2]
    if status and allowed[status] then
      local us = base_us + (k - 1) * step_us
      local s = string.format('%d.%06d', math.floor(us / 1e6), us % 1e6)
      move_indexes(prefix, id, dest, cur[3] or '', status, to, s, false)
      if waiting(to) then wake_queue(prefix, cur[3], now_s, wake_ttl) end
      redis.call('HSET', rkey, unpack(fields))
      if job ~= '' then redis.call('HSET', rkey, 'job_id', job) end
      if #unset > 0 then redis.call('HDEL', rkey, unpack(unset)) end
      acted[#acted + 1] = id
      out[k] = 1
    else
      out[k] = 0
    end
  end
end
flush_writes()
if channel ~= '' and #acted > 0 then
  redis.call('PUBLISH', channel, cjson.encode({event = 'messages.' .. action, ids = acted, at = tonumber(now_s)}))
end
return {out, woken}

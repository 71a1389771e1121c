-- One status change applied to many messages (a user's bulk requeue or cancel):
-- the same compare-and-set as transition.lua, without per-message JSON, and with one
-- Pub/Sub event per call listing the ids acted on.
--
-- KEYS: the resend record of each id, in the order of the ids below
-- ARGV: named (lib/args.lua): prefix (of the keys found at run time: lib/keys.lua), now
--   (epoch seconds, string), channel (Pub/Sub, "" = publish nothing), action (name for
--   the event: "requeued" -> "messages.requeued"), to (status after), from
--   (comma-separated statuses it may come from), unset (comma-separated fields to
--   delete, "" = none), score (first index score), step (score step between messages:
--   distinct scores, no ties), wake_ttl_ms (wake flag TTL);
-- then: number of fields to set N, then N field/value pairs; number of groups G, then
--   per group: job id ("" = none; else written as job_id), number of ids, the ids.
-- Index writes are made once per index for the whole call (lib/writes.lua).
-- Returns {per id in order: 1 changed, 0 skipped (other status, or no such message),
--          queues whose wake-up flag this call set (when messages became due)}.
--! include args
--! include keys
--! include writes
--! include move
--! include wakeup
local opts, pos = named_args()
local prefix, now_s, channel, action, to = K.setup(opts), opts.now, opts.channel, opts.action, opts.to
wake_setup(opts)
local allowed = {}
for _, s in ipairs(split(opts.from)) do allowed[s] = true end
local nset = tonumber(ARGV[pos])
pos = pos + 1
local fields = {'status', to, 'updated_at', now_s}
for _ = 1, nset do
  fields[#fields + 1] = ARGV[pos]
  fields[#fields + 1] = ARGV[pos + 1]
  pos = pos + 2
end
local unset = split(opts.unset)
-- Scores are counted in whole microseconds (exact in a double up to 2^53) and written
-- as "seconds.micros", so successive messages get distinct scores: formatting a float
-- sum with %.6f can round two neighbours to the same text. The first score is rounded
-- (not floored) to micros so that a caller counting in whole micros gets its number back.
local base_us = math.floor(tonumber(opts.score) * 1e6 + 0.5)
local step_us = math.max(1, math.floor(tonumber(opts.step) * 1e6 + 0.5))
local wake_ttl = tonumber(opts.wake_ttl_ms)
local ngroups = tonumber(ARGV[pos])
pos = pos + 1
local out, acted, k = {}, {}, 0
for _ = 1, ngroups do
  local job, n = ARGV[pos], tonumber(ARGV[pos + 1])
  pos = pos + 2
  for _ = 1, n do
    local id = ARGV[pos]
    pos = pos + 1
    k = k + 1
    local rkey = KEYS[k]
    local cur = redis.call('HMGET', rkey, 'status', 'destination', 'queue')
    local status, dest = cur[1], cur[2]
    if status and allowed[status] then
      local us = base_us + (k - 1) * step_us
      local s = string.format('%d.%06d', math.floor(us / 1e6), us % 1e6)
      move_indexes(prefix, id, dest, cur[3] or '', status, to, s, false)
      if waiting(to) then wake_queue(K.wake(prefix, cur[3]), cur[3], now_s, wake_ttl) end
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

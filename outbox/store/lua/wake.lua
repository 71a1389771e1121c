-- Which queues need a wake-up job: those with a message due by now (in the due index or
-- the quarantine index) whose wake-up flag is absent, or older than the stale limit (its
-- job was lost: e.g. taken off the queue by a worker that died before running it). Sets
-- the flag of each queue returned.
--
-- ARGV[1] prefix  ARGV[2] now (epoch seconds)  ARGV[3] flag TTL (ms)
-- ARGV[4] stale limit (seconds)  ARGV[5..] queue names
-- Returns the queues whose flag this call set: the caller enqueues one job for each.
local prefix, now_s, ttl, stale = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local now = tonumber(now_s)
local out = {}
for i = 5, #ARGV do
  local queue = ARGV[i]
  local first = redis.call('ZRANGE', prefix .. ':due:' .. queue, 0, 0, 'WITHSCORES')
  if not (first[2] and tonumber(first[2]) <= now) then
    first = redis.call('ZRANGE', prefix .. ':quarantine:' .. queue, 0, 0, 'WITHSCORES')
  end
  if first[2] and tonumber(first[2]) <= now then
    local flag_key = prefix .. ':wake:' .. queue
    local flag = redis.call('GET', flag_key)
    if (not flag) or (now - tonumber(flag) > stale) then
      redis.call('SET', flag_key, now_s, 'PX', ttl)
      out[#out + 1] = queue
    end
  end
end
return out

-- Which queues need a wake-up job: those with a message due by now (in the due index or
-- the quarantine index) whose wake-up flag is absent, or older than the stale limit (its
-- job was lost: e.g. taken off the queue by a worker that died before running it). Sets
-- the flag of each queue returned.
--
-- KEYS: per queue, in the order of the names below: its due index, its quarantine index,
--   its wake-up flag
-- ARGV[1] now (epoch seconds)  ARGV[2] flag TTL (ms)  ARGV[3] stale limit (seconds)
-- ARGV[4..] queue names
-- Returns the queues whose flag this call set: the caller enqueues one job for each.
local now_s, ttl, stale = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local now = tonumber(now_s)
local out = {}
for i = 4, #ARGV do
  local queue = ARGV[i]
  local k = 3 * (i - 4)
  local first = redis.call('ZRANGE', KEYS[k + 1], 0, 0, 'WITHSCORES')
  if not (first[2] and tonumber(first[2]) <= now) then
    first = redis.call('ZRANGE', KEYS[k + 2], 0, 0, 'WITHSCORES')
  end
  if first[2] and tonumber(first[2]) <= now then
    local flag_key = KEYS[k + 3]
    local flag = redis.call('GET', flag_key)
    if (not flag) or (now - tonumber(flag) > stale) then
      redis.call('SET', flag_key, now_s, 'PX', ttl)
      out[#out + 1] = queue
    end
  end
end
return out

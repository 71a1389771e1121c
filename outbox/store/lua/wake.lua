-- Which queues need a wake-up job: those with a message due by now (in the due index or
-- the quarantine index) whose wake-up flag is absent, or older than the stale limit (its
-- job was lost: e.g. taken off the queue by a worker that died before running it). Sets
-- the flag of each queue returned.
--
-- KEYS: per queue, in the order of the names below: its wake-up flag, then its due index
--   and its quarantine index in each partition (one pair with one partition)
-- ARGV[1] now (epoch seconds)  ARGV[2] flag TTL (ms)  ARGV[3] stale limit (seconds)
-- ARGV[4] partitions  ARGV[5..] queue names
-- Returns the queues whose flag this call set: the caller enqueues one job for each.
local now_s, ttl, stale, parts = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local now = tonumber(now_s)
local width = 1 + 2 * parts
local out = {}
local function due_now(key)
  local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  return first[2] and tonumber(first[2]) <= now
end
for i = 5, #ARGV do
  local queue = ARGV[i]
  local k = width * (i - 5)
  local due = false
  for j = k + 2, k + width do
    if due_now(KEYS[j]) then
      due = true
      break
    end
  end
  if due then
    local flag_key = KEYS[k + 1]
    local flag = redis.call('GET', flag_key)
    if (not flag) or (now - tonumber(flag) > stale) then
      redis.call('SET', flag_key, now_s, 'PX', ttl)
      out[#out + 1] = queue
    end
  end
end
return out

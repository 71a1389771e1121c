-- A queue's wake-up flag (outbox:wake:<queue>, docs/architecture.md), set by the scripts
-- that make messages due (create, bulk, release, unpark): SET NX with a TTL, so only
-- the first of them sets it while a wake-up job waits. `woken` lists the queues whose
-- flag this call set; the caller enqueues one wake-up job for each. Each queue is tried
-- once per call. `key` is the queue's flag (KEYS, or lib/keys.lua's K.wake).
local woken, wake_tried = {}, {}

local function wake_queue(key, queue, now_s, ttl_ms)
  if wake_tried[queue] then return end
  wake_tried[queue] = true
  if redis.call('SET', key, now_s, 'NX', 'PX', ttl_ms) then woken[#woken + 1] = queue end
end

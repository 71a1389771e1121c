-- A queue's wake-up flag (outbox:wake:<queue>, docs/architecture.md), set by the scripts
-- that make messages due (create, bulk, release, unpark): SET NX with a TTL, so only
-- the first of them sets it while a wake-up job waits. `woken` lists the queues whose
-- flag this call set; the caller enqueues one wake-up job for each. Each queue is tried
-- once per call. `key` is the queue's flag (KEYS, or lib/keys.lua's K.wake).
-- With more than one partition (wake_setup: the script's `parts` argument) the flags are
-- keys across the deployment ({g}), which a script of a partition must not touch:
-- `woken` then lists the queues this call made due, and the caller sets their flags
-- (MessageRepository.raise_wake_flags).
local woken, wake_tried = {}, {}
local wake_here = true

local function wake_setup(opts) wake_here = tonumber(opts.parts or '1') <= 1 end

local function wake_queue(key, queue, now_s, ttl_ms)
  if wake_tried[queue] then return end
  wake_tried[queue] = true
  if not wake_here then
    woken[#woken + 1] = queue
  elseif redis.call('SET', key, now_s, 'NX', 'PX', ttl_ms) then
    woken[#woken + 1] = queue
  end
end

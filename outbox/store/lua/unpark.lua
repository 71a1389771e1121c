-- Put parked messages of one destination back in their queue's due index, as far as its
-- gate allows (docs/destinations.md): all of them (a batch per call) when it is active
-- and its breaker closed; the oldest one when the breaker is open and a probe is due
-- (the next claim takes it as the probe); none while paused or disabled. Entries whose
-- message moved on (no longer pending/retrying) or was deleted are dropped. Keeps the
-- destination's entry in outbox:probes (when the wake check must look again) true.
--
-- KEYS[1] outbox:probes  KEYS[2] the destination's state hash (outbox:dest:<d>)
-- KEYS[3..] the destination's parked set in each partition (outbox:parked:<d>; one with
--   one partition), looked at in turn
-- ARGV: named (lib/args.lua): prefix (of the keys found at run time: lib/keys.lua, each
--   message's resend record, its queue's due index and wake-up flag), now (epoch
--   seconds), destination, batch (most messages to move), wake_ttl_ms (wake flag TTL)
-- Returns {moved, queues whose wake-up flag this call set (made due, with more than one
--   partition), parked left, what to do with outbox:probes (false: done here)}.
--! include args
--! include keys
--! include wakeup
--! include guard
local opts = named_args()
local prefix, now_s, dest, batch, wake_ttl = K.setup(opts), opts.now, opts.destination, tonumber(opts.batch), tonumber(opts.wake_ttl_ms)
wake_setup(opts)
local now = tonumber(now_s)
-- With more than one partition (one per call): KEYS the partition's parked set alone, the
-- destination's state given (named: admin, breaker, next_probe_at, probe_deadline, read
-- from its home slot), and outbox:probes left to the caller: the reply's last element
-- says what to do with it ({"rem"} or {"add", at}).
local probe_op = false
local probes, first_parked, v = KEYS[1], 3, nil
if K.parts > 1 then
  first_parked = 1
  v = {opts.admin ~= '' and opts.admin or false, opts.breaker ~= '' and opts.breaker or false,
       opts.next_probe_at ~= '' and opts.next_probe_at or false, opts.probe_deadline ~= '' and opts.probe_deadline or false}
else
  v = redis.call('HMGET', KEYS[2], 'admin', 'breaker', 'next_probe_at', 'probe_deadline')
end
local function probe_rem()
  if K.parts > 1 then probe_op = {'rem'} else redis.call('ZREM', probes, dest) end
end
local function probe_add(at)
  if K.parts > 1 then probe_op = {'add', string.format('%.6f', at)} else redis.call('ZADD', probes, at, dest) end
end
-- The entries of each parked set, counted before any is taken and kept up to date as the
-- loop below takes them, so that no set is read again once this call has emptied it: on
-- a slot held half-moved by a legacy migration a key that no longer exists is a non-local
-- key, and reading it (for more rows, or to count what is left) aborted the script after
-- its writes (the messages due again, the caller told of an error).
local in_set = {}
for i = first_parked, #KEYS do in_set[i] = redis.call('ZCARD', KEYS[i]) end
local function parked_left()
  local left = 0
  for i = first_parked, #KEYS do left = left + in_set[i] end
  return left
end
local admin, breaker = v[1] or 'active', v[2] or 'closed'
local next_probe, probe_deadline = tonumber(v[3] or '0'), tonumber(v[4] or '0')
if admin ~= 'active' then
  probe_rem()  -- resume/enable unparks
  return {0, {}, parked_left(), probe_op}
end
local want = batch
if breaker ~= 'closed' then
  local due = (breaker == 'open' and now >= next_probe) or (breaker == 'half_open' and now > probe_deadline)
  if not due then
    if breaker == 'open' then probe_add(next_probe) else probe_add(probe_deadline) end
    return {0, {}, parked_left(), probe_op}
  end
  want = 1
end
-- With more than one partition, the rows the loop below may look at (the first `batch`
-- of the one parked set), their records and the due indexes they go back to are checked
-- before its first write (lib/guard.lua).
if K.parts > 1 then
  local ids, keys = redis.call('ZRANGE', KEYS[first_parked], 0, batch - 1), {}
  for i, id in ipairs(ids) do keys[i] = K.resend(prefix, id) end
  local refused = keys_here(KEYS[first_parked], keys)
  if refused then return refused end
  keys = {}
  for _, id in ipairs(ids) do
    local queue = redis.call('HGET', K.resend(prefix, id), 'queue')
    if queue then keys[#keys + 1] = K.due(K.part(prefix, id), queue) end
  end
  refused = keys_here(KEYS[first_parked], keys)
  if refused then return refused end
end
local moved = 0
local looked = 0
local part = first_parked
while moved < want and looked < batch and part <= #KEYS do
  local pkey = KEYS[part]
  local rows = {}
  if in_set[part] > 0 then rows = redis.call('ZRANGE', pkey, 0, want - moved - 1, 'WITHSCORES') end
  if #rows == 0 then part = part + 1 end
  for i = 1, #rows, 2 do
    local id, score = rows[i], rows[i + 1]
    looked = looked + 1
    in_set[part] = in_set[part] - redis.call('ZREM', pkey, id)
    local cur = redis.call('HMGET', K.resend(prefix, id), 'status', 'destination', 'queue')
    if (cur[1] == 'pending' or cur[1] == 'retrying') and cur[2] == dest and cur[3] then
      redis.call('ZADD', K.due(K.part(prefix, id), cur[3]), score, id)
      moved = moved + 1
      wake_queue(K.wake(prefix, cur[3]), cur[3], now_s, wake_ttl)
    end
  end
end
local left = parked_left()
if left == 0 then
  probe_rem()
elseif breaker == 'closed' then
  probe_add(now)  -- more to move: the next wake check goes on
else
  probe_add(now + 5)  -- the claim of the probe moves this to its lease deadline
end
return {moved, woken, left, probe_op}

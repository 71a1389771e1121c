-- Give claimed messages back without charging an attempt: sending -> pending (no
-- retries yet) or retrying, due now, back in their queue's due index, which is woken.
-- Only messages still held under the given lease are released.
--
-- KEYS[1] outbox:destinations; KEYS[2..] the resend records of the ids below, in order.
--   With more than one partition (one per call): KEYS the resend records of the ids, or
--   without ids one key of the partition; named destinations (JSON list) and partition
-- ARGV: named (lib/args.lua): prefix (of the keys found at run time: lib/keys.lua), now
--   (epoch seconds), lease (token), deadline (lease deadline: when no ids follow, every
--   id in a sending index, of any destination, with this exact score is a candidate: a
--   claim whose reply was lost), wake_ttl_ms (wake flag TTL); then the ids (optional)
-- Returns {ids released, queues whose wake-up flag this call set (made due, with more than
--   one partition), the destination of each id released}.
-- Index writes are made once per index for the whole call (lib/writes.lua, lib/move.lua).
--! include args
--! include keys
--! include writes
--! include move
--! include wakeup
--! include guard
local opts, pos = named_args()
local prefix, now_s, lease, deadline, wake_ttl = K.setup(opts), opts.now, opts.lease, opts.deadline, tonumber(opts.wake_ttl_ms)
wake_setup(opts)
local ids, rkeys = {}, {}
-- with more than one partition: no outbox:destinations in KEYS[1] (a key across the
-- deployment) but a key of the partition, the destinations given, one partition per call
local first_rkey = K.parts > 1 and 1 or 2
local dests, parts = nil, nil
if K.parts > 1 then
  dests, parts = cjson.decode(opts.destinations or '[]'), {tonumber(opts.partition or '0')}
else
  dests, parts = redis.call('SMEMBERS', KEYS[1]), {}
  for k = 0, K.parts - 1 do parts[#parts + 1] = k end
end
if #ARGV >= pos then
  for i = pos, #ARGV do
    ids[#ids + 1] = ARGV[i]
    rkeys[#rkeys + 1] = KEYS[#rkeys + first_rkey]
  end
else
  local sending = {}
  for _, dest in ipairs(dests) do
    for _, k in ipairs(parts) do sending[#sending + 1] = K.status(K.partition(prefix, k), 'sending', dest) end
  end
  local refused = keys_here(KEYS[1], sending)
  if refused then return refused end
  for _, key in ipairs(sending) do
    for _, id in ipairs(redis.call('ZRANGEBYSCORE', key, deadline, deadline)) do
      ids[#ids + 1] = id
      rkeys[#rkeys + 1] = K.resend(prefix, id)
    end
  end
  refused = keys_here(KEYS[1], rkeys)  -- records found at run time (given ids' are declared)
  if refused then return refused end
end
-- Every read first, and a check that the keys found at run time are here (lib/guard.lua);
-- then the writes.
local chosen, keys, seen = {}, {}, {}
for i, id in ipairs(ids) do
  local rkey = rkeys[i]
  local cur = redis.call('HMGET', rkey, 'status', 'destination', 'queue', 'lease', 'retry_count')
  if cur[1] == 'sending' and cur[4] == lease and not seen[id] then
    seen[id] = true
    local to = 'pending'
    if tonumber(cur[5] or '0') > 0 then to = 'retrying' end
    chosen[#chosen + 1] = {id = id, rkey = rkey, dest = cur[2], queue = cur[3] or '', to = to}
    index_keys(keys, K.part(prefix, id), cur[2], cur[3] or '', 'sending', to)
  end
end
local refused = keys_here(KEYS[1], keys)
if refused then return refused end
local released, released_dests = {}, {}
for _, c in ipairs(chosen) do
  move_indexes(prefix, c.id, c.dest, c.queue, 'sending', c.to, now_s, false)
  redis.call('HSET', c.rkey, 'status', c.to, 'next_attempt_at', now_s, 'updated_at', now_s)
  redis.call('HDEL', c.rkey, 'lease')
  released[#released + 1] = c.id
  released_dests[#released_dests + 1] = c.dest
  wake_queue(K.wake(prefix, c.queue), c.queue, now_s, wake_ttl)
end
flush_writes()
return {released, woken, released_dests}

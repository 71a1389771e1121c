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
-- Ordered messages (lib/ordering.lua): one cancelled leaves its key (the next becomes the
-- head, and its queue is woken); one requeued goes back into its key (a blocking dead
-- letter stays the head, the key unblocked; one that had left joins the tail and is
-- 'waiting' unless it is the head): the requeued messages of one key join it in their
-- original order (sequence numbers). Named argument okttl: seconds an ordering key's
-- state is kept after its last message left.
-- A requeue of a published event's delivery (its resend record's `payload`: the event
-- id) whose payload record is gone (purged, or deleted by hand) is refused: 2.
-- Returns {per id in order: 1 changed, 0 skipped (other status, or no such message), 2
--          refused (its event's payload was purged),
--          queues whose wake-up flag this call set (when messages became due)}.
--! include args
--! include keys
--! include writes
--! include move
--! include wakeup
--! include guard
--! include join
--! include ordering
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
local okttl = tonumber(opts.okttl or '604800')
local out, acted, k = {}, {}, 0
local later = {}  -- requeued ordered messages, joined to their keys in sequence order
local function apply(e)
  local id, rkey, cur, dest, queue = e.id, e.rkey, e.cur, e.cur[2], e.cur[3] or ''
  -- An ordered message's status now: an earlier message of this call may have changed it
  -- (a key's head cancelled promotes the next message from 'waiting' to 'pending',
  -- lib/ordering.lua); moved out of the index it was read in, it would stay in the one it
  -- is in. Only an ordered message is promoted: the others are not read again.
  local status = cur[1]
  if cur[4] then
    status = redis.call('HGET', rkey, 'status')
    if not (status and allowed[status]) then
      out[e.k] = 0
      return
    end
    cur[1] = status
  end
  if cur[7] and to == 'pending' and redis.call('EXISTS', K.payload(K.part(prefix, id), cur[7])) == 0 then
    out[e.k] = 2  -- the event's payload was purged: nothing to send
    return
  end
  local us = base_us + (e.k - 1) * step_us
  local s = string.format('%d.%06d', math.floor(us / 1e6), us % 1e6)
  local okey, pp = cur[4], K.part(prefix, id)
  local target, order = to, nil
  if okey and to == 'pending' then
    local head, seq, last, epoch = order_requeue(pp, dest, okey, id, now_s)
    if seq then
      order = {'oseq', seq, 'oepoch', epoch}
      if head and last then order[5], order[6] = 'oprev', last end
    end
    if not head then target = 'waiting' end
  end
  move_indexes(prefix, id, dest, queue, status, target, s, false)
  if waiting(target) then wake_queue(K.wake(prefix, queue), queue, now_s, wake_ttl) end
  redis.call('HSET', rkey, unpack(fields))
  if target ~= to then redis.call('HSET', rkey, 'status', target) end
  if order then
    redis.call('HSET', rkey, unpack(order))
    if not order[5] then redis.call('HDEL', rkey, 'oprev') end
  end
  if e.job ~= '' then redis.call('HSET', rkey, 'job_id', e.job) end
  if #unset > 0 then redis.call('HDEL', rkey, unpack(unset)) end
  if okey and to == 'cancelled' then
    local q = order_leave(prefix, pp, dest, okey, id, nil, okttl, now_s)
    if q then wake_queue(K.wake(prefix, q), q, now_s, wake_ttl) end
  end
  acted[#acted + 1] = id
  out[e.k] = 1
end
local now_entries, seen = {}, {}  -- entries applied in call order (all but ordered requeues)
for _ = 1, ngroups do
  local job, n = ARGV[pos], tonumber(ARGV[pos + 1])
  pos = pos + 2
  for _ = 1, n do
    local id = ARGV[pos]
    pos = pos + 1
    k = k + 1
    local rkey = KEYS[k]
    local cur = redis.call('HMGET', rkey, 'status', 'destination', 'queue', 'okey', 'oseq', 'oepoch', 'payload')
    local status = cur[1]
    if status and allowed[status] and not seen[id] then  -- an id given twice: acted on once
      seen[id] = true
      local e = {id = id, rkey = rkey, cur = cur, k = k, job = job}
      if cur[4] and to == 'pending' then later[#later + 1] = e else now_entries[#now_entries + 1] = e end
    else
      out[k] = 0
    end
  end
end
-- Every key the writes below may touch is checked before the first of them
-- (lib/guard.lua): the indexes of each message, its key's queue and state, and, for an
-- ordered message cancelled at its key's head, the messages that may become the head.
if k > 0 then
  local keys, cancels = {}, {}
  local function add(e)
    local pp, dest, queue, okey = K.part(prefix, e.id), e.cur[2], e.cur[3] or '', e.cur[4]
    index_keys(keys, pp, dest, queue, e.cur[1], to)
    if e.cur[7] and to == 'pending' then keys[#keys + 1] = K.payload(pp, e.cur[7]) end
    if okey then
      if to == 'pending' then keys[#keys + 1] = K.status(pp, 'waiting', dest) end  -- behind its head
      local q = order_key_names(keys, pp, dest, okey)
      if to == 'cancelled' then cancels[q] = (cancels[q] or 0) + 1 end
    end
  end
  for _, e in ipairs(now_entries) do add(e) end
  for _, e in ipairs(later) do add(e) end
  local refused = keys_here(KEYS[1], keys) or heirs_here(prefix, KEYS[1], cancels)
  if refused then return refused end
end
for _, e in ipairs(now_entries) do apply(e) end
-- Ordered requeues rejoin their key in the order they were first sent: by key, then the
-- key's lifetime (its epoch "<ms>-<id>" starts with when that lifetime began; a message
-- of a lifetime from before epochs existed has none: the oldest), then sequence (which
-- restarts at 1 in each lifetime). Ties keep the call's order.
local function lifetime(e) return tonumber(string.match(e.cur[6] or '', '^(%d+)-') or '0') end
table.sort(later, function(a, b)
  if a.cur[4] ~= b.cur[4] then return a.cur[4] < b.cur[4] end
  local la, lb = lifetime(a), lifetime(b)
  if la ~= lb then return la < lb end
  local sa, sb = tonumber(a.cur[5]) or 0, tonumber(b.cur[5]) or 0
  if sa ~= sb then return sa < sb end
  return a.k < b.k
end)
for _, e in ipairs(later) do apply(e) end
flush_writes()
if channel ~= '' and #acted > 0 then
  redis.call('PUBLISH', channel, cjson.encode({event = 'messages.' .. action, ids = acted, at = tonumber(now_s)}))
end
return {out, woken}

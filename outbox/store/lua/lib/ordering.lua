--! needs keys writes move guard join
-- Ordered delivery (docs/concepts.md, "Ordered delivery"): the messages of one
-- (destination, ordering key) are delivered one at a time, in the order they joined the
-- key. A key keeps, in its messages' partition:
-- * its queue, K.order: its unsettled messages (id -> sequence number); the lowest is the
--   head, the only one that is ever pending, retrying, sending or a dead letter; the
--   others are 'waiting' (in their destination's 'waiting' status index, never in a due
--   index), so nothing behind the head is claimed, whatever the head's backoff;
-- * its state, K.order_state: seq (the last sequence number given), last (the sequence of
--   the last message delivered: a new head is told it, as its oprev), blocked (the id of
--   the dead letter at its head while it blocks the key), epoch (the generation of this
--   state: "<milliseconds>-<id>" of the join that created it, or that first joined a state
--   written before epochs existed; sent as Outbox-Ordering-Epoch, so a receiver tells a
--   restarted key from a repeat). It expires `ttl` seconds after the queue empties (a
--   later message starts again at 1, with no oprev, in a new epoch);
-- * its destination's blocked keys, K.blocked: key -> when it was blocked;
-- * its log, K.order_log: every message of the key (id -> created_at) until it is
--   deleted (create.lua adds, delete.lua removes): the console's list of one key.
-- The resend record of an ordered message holds okey (its key), oseq (its sequence),
-- oepoch (its key's epoch when it got that sequence) and, once it is the head, oprev.
-- Every read of these functions comes before their writes. Needs lib/keys.lua,
-- lib/writes.lua, lib/move.lua, lib/guard.lua and lib/join.lua (order_join) included
-- before this file.

-- The message after the head `id` of a key, when `id` is the head (else nil, false), and
-- how many messages the key's queue holds, counted up to 2.
local function order_next(q, id)
  local first = redis.call('ZRANGE', q, 0, 1)
  if first[1] ~= id then return nil, false, #first end
  return first[2], true, #first
end

-- The key queues this call emptied (order_leave): deleted, so not touched again. On a slot
-- held half-moved by a legacy migration a key missing from it is a non-local key, and
-- any access (a read, or a write creating it again) aborted the script after its writes.
local order_emptied = {}

-- Message `nxt` (waiting behind the head that left) becomes the head: pending, in its
-- queue's due index at its own due time (an older message is due at once), told the
-- sequence delivered before it. Returns its queue (the caller may wake it), or nil when
-- it was not waiting.
local function order_promote(prefix, pp, dest, st, nxt, now_s)
  local rkey = K.resend(prefix, nxt)
  local cur = redis.call('HMGET', rkey, 'status', 'queue', 'next_attempt_at')
  local last = redis.call('HGET', st, 'last')
  if cur[1] ~= 'waiting' then return nil end
  local queue = cur[2] or ''
  move_indexes(prefix, nxt, dest, queue, 'waiting', 'pending', cur[3] or now_s, false)
  redis.call('HSET', rkey, 'status', 'pending', 'updated_at', now_s)
  if last then redis.call('HSET', rkey, 'oprev', last) else redis.call('HDEL', rkey, 'oprev') end
  return queue
end

-- Message `id` of key `key` leaves the key's queue: delivered (`delivered`: its sequence
-- number), cancelled, deleted, or skipped as a dead letter. A dead letter that blocked
-- the key no longer does. When it was the head, the next message becomes the head.
-- Returns the new head's queue when one became due (the caller may wake it), else nil.
local function order_leave(prefix, pp, dest, key, id, delivered, ttl, now_s)
  local q, st = K.order(pp, dest, key), K.order_state(pp, dest, key)
  local gone = order_emptied[q]  -- an earlier message of this call emptied it: not in it
  local nxt, was_head, seen = nil, false, 0
  if not gone then nxt, was_head, seen = order_next(q, id) end
  local blocked = redis.call('HGET', st, 'blocked')
  local queue = nil
  if delivered then redis.call('HSET', st, 'last', delivered) end
  if blocked == id then
    redis.call('HDEL', st, 'blocked')
    redis.call('ZREM', K.blocked(pp, dest), key)
  end
  if not gone then redis.call('ZREM', q, id) end
  if was_head and nxt then
    queue = order_promote(prefix, pp, dest, st, nxt, now_s)
  elseif not gone and (seen == 0 or (seen == 1 and was_head)) then
    -- the queue is empty now (`id` was all of it; read before the ZREM, not after: a
    -- key emptied on a half-moved slot is a non-local key, see order_emptied)
    order_emptied[q] = true
    redis.call('EXPIRE', st, ttl)
  end
  return queue
end

-- The dead letter `id` at the head of key `key` blocks it (policy "block"): the key
-- waits behind it until it is requeued, cancelled or deleted.
local function order_block(pp, dest, key, id, now_s)
  redis.call('HSET', K.order_state(pp, dest, key), 'blocked', id)
  redis.call('ZADD', K.blocked(pp, dest), now_s, key)
end

-- A requeued message `id` of key `key` goes back into its key: a blocked dead letter at
-- the head stays the head (the key is no longer blocked); a message that had left the key
-- (delivered, cancelled, skipped) joins its tail with a new sequence number. Returns
-- whether it is the head, and its new sequence, oprev and epoch (nil when it kept its
-- place).
local function order_requeue(pp, dest, key, id, now)
  local q, st = K.order(pp, dest, key), K.order_state(pp, dest, key)
  local nxt, was_head = order_next(q, id)
  if was_head then
    if redis.call('HGET', st, 'blocked') == id then
      redis.call('HDEL', st, 'blocked')
      redis.call('ZREM', K.blocked(pp, dest), key)
    end
    return true, nil, nil
  end
  if redis.call('ZSCORE', q, id) then return false, nil, nil end  -- already in line
  return order_join(q, st, id, now)
end

-- The keys of ordering key `key` of `dest` in partition prefix `pp` that a message's
-- leaving or rejoining the key writes (its queue, its state, the destination's blocked
-- keys), added to the list `out`, for keys_here. Returns the key's queue.
local function order_key_names(out, pp, dest, key)
  local q = K.order(pp, dest, key)
  out[#out + 1] = q
  out[#out + 1] = K.order_state(pp, dest, key)
  out[#out + 1] = K.blocked(pp, dest)
  return q
end

-- The messages that may become the head of ordering keys this call removes messages from
-- (`leaving`: a key's queue -> how many of its messages may leave it), checked as
-- keys_here does: their resend records, then the indexes their promotion writes
-- (order_promote). Returns nil or the error reply to return.
local function heirs_here(prefix, anchor, leaving)
  if K.parts <= 1 then return nil end
  local ids, rkeys = {}, {}
  for q, m in pairs(leaving) do
    for _, id in ipairs(redis.call('ZRANGE', q, 0, m)) do
      ids[#ids + 1] = id
      rkeys[#rkeys + 1] = K.resend(prefix, id)
    end
  end
  local refused = keys_here(anchor, rkeys)
  if refused then return refused end
  local keys = {}
  for i, id in ipairs(ids) do
    local v = redis.call('HMGET', rkeys[i], 'destination', 'queue')
    if v[1] then index_keys(keys, K.part(prefix, id), v[1], v[2] or '', 'waiting', 'pending') end
  end
  return keys_here(anchor, keys)
end

-- Create messages: message record, resend record, the destination's status and creation
-- indexes, the queue's due index,
-- idempotency key, and the wake-up flag of each queue that has work due now.
-- Atomic per call. Idempotent on the message id: a message whose record exists is
-- left as it is (the on-commit fast path and the relay may both push it).
--
-- ARGV[1] prefix
-- ARGV[2] idempotency TTL in seconds (0 = keep for ever)
-- ARGV[3] wake flag TTL in milliseconds
-- ARGV[4] now (epoch seconds), ARGV[5] due slack (seconds): a message due by now+slack wakes its queue
-- ARGV[6] "1" to check whether each id was already written (a push of captured
--         messages, which the fast path and the relay may both make), "0" for new ids
--         (the call itself may still run twice: see "guarded" below)
-- ARGV[7] number of messages N, then per message:
--   id, idempotency key name ("" = none; already scoped by destination),
--   fingerprint (of body and content type; "" without a key), destination, queue,
--   status, status score (when it is due: also its resend record's next_attempt_at),
--   created_at, the message record (one string: its header line and the body,
--   outbox.records.Message.message_value), n_resend_fields, then the resend record's
--   other field/value pairs (n_resend_fields of them). The script writes status,
--   destination, queue and next_attempt_at itself from the arguments above, so they
--   are not sent twice (each argument costs Redis and the client about 0.4 us).
-- The pairs go to HSET as a range of ARGV (unpack, in C): the script never walks them.
-- Returns one flat array: the number of queues whose wake-up flag this call set, those
-- queue names (the caller enqueues their job), then, for each message that was not
-- written as new, its position (1-based), its standing id and its code:
-- "exists" (this id was already written), "duplicate" (the key names another message
-- with the same fingerprint: its id stands), "conflict" (the key names another message
-- with a different fingerprint: its id is returned) or "refused" (not written because
-- another message of the call is a conflict: a call with a conflict writes nothing).
-- Every message not listed was written ("new"): the common reply is {0} or {1, queue}.
-- The message records and index entries are written once per key for the whole call
-- (lib/writes.lua: one MSET, one ZADD per index).
--! include writes
--! include wakeup
local prefix = ARGV[1]
local idem_ttl = tonumber(ARGV[2])
local wake_ttl = tonumber(ARGV[3])
local now = tonumber(ARGV[4])
local due_by = now + tonumber(ARGV[5])
local check_exists = ARGV[6] == '1'
local n = tonumber(ARGV[7])
write_at_once(n == 1)
local pos = 8
local msgs = {}
local conflict = false
for i = 1, n do
  -- One constructor, so Lua sizes the table once instead of growing it field by field.
  local last = pos + 9 + tonumber(ARGV[pos + 9]) * 2
  local m = {
    id = ARGV[pos], idem = ARGV[pos + 1], fp = ARGV[pos + 2], dest = ARGV[pos + 3],
    queue = ARGV[pos + 4], status = ARGV[pos + 5], score = ARGV[pos + 6], created = ARGV[pos + 7],
    record = pos + 8, rfirst = pos + 10, rlast = last, code = 'new', standing = ARGV[pos],
  }
  pos = last + 1
  -- First pass: what would happen to each message.
  if check_exists and redis.call('EXISTS', prefix .. ':message:' .. m.id) == 1 then
    m.code = 'exists'
  elseif m.idem ~= '' then
    local held = redis.call('GET', prefix .. ':idempotency:' .. m.idem)
    if held then
      local sep = string.find(held, '|', 1, true)
      local held_id, held_fp = held, ''
      if sep then held_id, held_fp = string.sub(held, 1, sep - 1), string.sub(held, sep + 1) end
      if held_id ~= m.id then
        m.standing = held_id
        if held_fp == m.fp then m.code = 'duplicate' else m.code = 'conflict'; conflict = true end
      end
    end
  end
  msgs[i] = m
end
-- A call for fresh ids (ARGV[6] "0") that runs again (redis-py's Retry resends a command
-- after a ConnectionError or TimeoutError, also when the first run reached Redis and only
-- its reply was lost) must not write anything again: a worker may have claimed or
-- delivered the messages meanwhile. The call is atomic, so its first new message's record
-- tells whether it ran: that record is written first, with SET NX (no extra command).
local guarded = nil
if not check_exists and not conflict then
  for _, m in ipairs(msgs) do
    if m.code == 'new' then
      if redis.call('SET', prefix .. ':message:' .. m.id, ARGV[m.record], 'NX') then
        guarded = m
      else
        for _, again in ipairs(msgs) do
          if again.code == 'new' then again.code = 'exists' end
        end
      end
      break
    end
  end
end
local dests = {}
local others = {}
for i, m in ipairs(msgs) do
  -- Second pass: write, unless a conflict refuses the whole call (nothing half-written).
  if m.code == 'new' and not conflict then
    local id, dest, queue, status, score = m.id, m.dest, m.queue, m.status, m.score
    if m.idem ~= '' then
      local ikey = prefix .. ':idempotency:' .. m.idem
      if idem_ttl > 0 then
        redis.call('SET', ikey, id .. '|' .. m.fp, 'EX', idem_ttl)
      else
        redis.call('SET', ikey, id .. '|' .. m.fp)
      end
    end
    if m ~= guarded then mset_later(prefix .. ':message:' .. id, ARGV[m.record]) end
    redis.call('HSET', prefix .. ':resend:' .. id, 'status', status, 'destination', dest, 'queue', queue,
      'next_attempt_at', score, unpack(ARGV, m.rfirst, m.rlast))
    zadd_later(prefix .. ':status:' .. status .. ':dest:' .. dest, score, id)
    zadd_later(prefix .. ':due:' .. queue, score, id)
    zadd_later(prefix .. ':created:dest:' .. dest, m.created, id)
    if not dests[dest] then
      dests[dest] = true
      redis.call('SADD', prefix .. ':destinations', dest)
    end
    if tonumber(score) <= due_by then wake_queue(prefix, queue, ARGV[4], wake_ttl) end
  else
    if m.code == 'new' then m.code = 'refused' end
    others[#others + 1] = {i, m.standing, m.code}
  end
end
flush_writes()
local reply = {#woken}
for _, q in ipairs(woken) do reply[#reply + 1] = q end
for _, o in ipairs(others) do
  reply[#reply + 1] = o[1]
  reply[#reply + 1] = o[2]
  reply[#reply + 1] = o[3]
end
return reply

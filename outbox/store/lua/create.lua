-- Create messages: message record, resend record, the destination's status and creation
-- indexes, the queue's due index, idempotency key, and the wake-up flag of each queue that
-- has work due now. (One plain message, send()'s common call, goes to lua/create_one.lua,
-- which makes the same writes.)
-- Atomic per call. Idempotent on the message id: a message whose record exists is
-- left as it is (the on-commit fast path and the relay may both push it).
--
-- KEYS: per group of messages with one (status, destination, queue), in order: its
--   status index (outbox:status:<status>:dest:<d>), its queue's due index, its
--   destination's created index and its queue's wake-up flag (4 keys each, once per
--   group: send_many shares them); then per message, in order: its message record, its
--   resend record, when it has an idempotency key that key
--   (outbox:idempotency:<n>:<d>:<key>), and when it has an ordering key that key's queue
--   and state, its destination's 'waiting' status index and the key's log
--   (lib/ordering.lua: a message with messages of its key ahead of it is written
--   'waiting', in no due index). With more than one partition (parts > 1: every message
--   of the call is in one partition, whose slot every key is in) there is no wake-up
--   flag (3 keys per group): the caller sets the flags of the queues returned
--   (lib/wakeup.lua). Last, after the payload records (below), on one server only:
--   outbox:destinations, to which the call adds its destinations' names (every call, so a
--   name Redis lost is listed again from the next message; with more than one partition
--   the caller adds them itself, outbox/store/base.py REGISTER_AGAIN).
-- ARGV, by position (create is send()'s script, and every argument costs Redis and
--   the client about 0.3 us: no names, no list of field names; the Python side names
--   them in outbox.store.messages.CREATE_HEADER, CREATE_GROUP and CREATE_FIELDS):
--   1 idem_ttl (seconds; 0 = keep for ever), 2 wake_ttl_ms (wake flag TTL), 3 now (epoch
--   seconds), 4 slack (seconds: a message due by now + slack wakes its queue), 5 repeat
--   ("1" to check whether each id was already written: a push of captured messages,
--   which the fast path and the relay may both make; "0" for new ids, the call itself
--   may still run twice: see "guarded" below), 6 n (number of messages N), 7 groups
--   (number of groups G), 8 parts (partitions);
-- then per group (3 each, in group order): status, dest, queue;
-- then per message (8 each): id, fp (fingerprint of body and content type; "" when the
--   message has no idempotency key), group (its group's number, 1..G), score (status
--   score; when it is due, also its resend record's next_attempt_at), created
--   (created_at; also the resend record's updated_at unless a pair below says
--   otherwise), record (the message record: one string, its header line and the body,
--   outbox.records.Message.message_value), ordered ("1" when it has an ordering key:
--   its resend fields hold okey), n_resend; then the resend record's other field/value
--   pairs (n_resend of them). The script writes status, destination, queue,
--   next_attempt_at and updated_at itself from the fields above, so they are not sent
--   twice.
-- The pairs go to HSET as a range of ARGV (unpack, in C): the script never walks them.
-- Then, after the last message, the payloads of published events (absent: none): their
--   number P, then per payload: content_type, body, the number of messages referencing
--   it and their positions (1-based); and in KEYS, after the last message's keys, each
--   payload's record (outbox:payload:<event id>, in the call's partition). A payload
--   record holds body, content_type and refs, the number of its deliveries that exist:
--   refs grows by the messages of this call written as new (not those that exist, are
--   duplicates, or are refused), so a call run again or a publish repeated under its key
--   counts nothing twice, and a record is written only with a delivery referencing it.
--   lua/delete.lua takes refs down and deletes the record with its last delivery.
-- Returns one flat array: the number of queues whose wake-up flag this call set, those
-- queue names (the caller enqueues their job), then, for each message that was not
-- written as new, its position (1-based), its standing id and its code:
-- "exists" (this id was already written), "duplicate" (the key names another message
-- with the same fingerprint: its id stands), "conflict" (the key names another message
-- with a different fingerprint: its id is returned) or "refused" (not written because
-- another message of the call is a conflict: a call with a conflict writes nothing);
-- and for each message with an ordering key written as new, its position, its id and
-- "ordered:<status>:<seq>:<prev>" (status "pending" at its key's head, else "waiting";
-- its sequence in the key; the sequence delivered before it, or "").
-- Every other message not listed was written ("new"): the common reply is {0} or {1, queue}.
-- The message records and index entries are written once per key for the whole call
-- (lib/writes.lua: one MSET, one ZADD per index; appended without gather()'s tracking of
-- members, since every id is written once and nothing is removed).
--! include writes
--! include wakeup
--! include join
local idem_ttl = tonumber(ARGV[1])
local wake_ttl = ARGV[2]
local now_s = ARGV[3]
local due_by = tonumber(now_s) + tonumber(ARGV[4])
local check_exists = ARGV[5] == '1'
local n = tonumber(ARGV[6])
local n_groups = tonumber(ARGV[7])
local shared = tonumber(ARGV[8]) <= 1  -- KEYS hold wake-up flags
write_at_once(n == 1)
wake_setup({parts = ARGV[8]})
local width = shared and 4 or 3  -- keys per group
local msgs = {}
local conflict = false
local k = 1 + width * n_groups  -- the next message's first key
local pos = 9 + 3 * n_groups  -- the next message's first argument
for i = 1, n do
  local ga = 9 + 3 * (tonumber(ARGV[pos + 2]) - 1)  -- its group's first argument
  local last = pos + 7 + tonumber(ARGV[pos + 7]) * 2
  -- One constructor, so Lua sizes the table once instead of growing it field by field.
  local m = {
    id = ARGV[pos], fp = ARGV[pos + 1], score = ARGV[pos + 3], created = ARGV[pos + 4],
    record = ARGV[pos + 5], status = ARGV[ga], dest = ARGV[ga + 1], queue = ARGV[ga + 2],
    rfirst = pos + 8, rlast = last, code = 'new', standing = ARGV[pos],
  }
  local g = 1 + width * (tonumber(ARGV[pos + 2]) - 1)  -- its group's first key
  m.skey, m.dkey, m.ckey = KEYS[g], KEYS[g + 1], KEYS[g + 2]
  if shared then m.wkey = KEYS[g + 3] end
  m.mkey, m.rkey = KEYS[k], KEYS[k + 1]
  k = k + 2
  if m.fp ~= '' then
    m.ikey = KEYS[k]
    k = k + 1
  end
  if ARGV[pos + 6] == '1' then
    m.okey, m.ostate, m.waitkey, m.logkey = KEYS[k], KEYS[k + 1], KEYS[k + 2], KEYS[k + 3]
    k = k + 4
  end
  pos = last + 1
  -- First pass: what would happen to each message.
  if check_exists and redis.call('EXISTS', m.mkey) == 1 then
    m.code = 'exists'
  elseif m.ikey then
    local held = redis.call('GET', m.ikey)
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
-- A call for fresh ids (repeat "0") that runs again (redis-py's Retry resends a command
-- after a ConnectionError or TimeoutError, also when the first run reached Redis and only
-- its reply was lost) must not write anything again: a worker may have claimed or
-- delivered the messages meanwhile. The call is atomic, so its first new message's record
-- tells whether it ran: that record is written first, with SET NX (no extra command).
local guarded = nil
if not check_exists and not conflict then
  for _, m in ipairs(msgs) do
    if m.code == 'new' then
      if redis.call('SET', m.mkey, m.record, 'NX') then
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
local others = {}
for i, m in ipairs(msgs) do
  -- Second pass: write, unless a conflict refuses the whole call (nothing half-written).
  if m.code == 'new' and not conflict then
    local id, dest, queue, status, score = m.id, m.dest, m.queue, m.status, m.score
    if m.ikey then
      local ikey = m.ikey
      if idem_ttl > 0 then
        redis.call('SET', ikey, id .. '|' .. m.fp, 'EX', idem_ttl)
      else
        redis.call('SET', ikey, id .. '|' .. m.fp)
      end
    end
    if m ~= guarded then mset_once(m.mkey, m.record) end
    local skey, due = m.skey, true
    local order = {}
    if m.okey then
      local head, seq, last, epoch = order_join(m.okey, m.ostate, id, now_s)
      order = {'oseq', seq, 'oepoch', epoch}
      redis.call('ZADD', m.logkey, m.created, id)
      if head then
        if last then order[5], order[6] = 'oprev', last end
      else
        status, skey, due = 'waiting', m.waitkey, false
      end
      others[#others + 1] = {i, id, 'ordered:' .. status .. ':' .. seq .. ':' .. (head and last or '') .. ':' .. epoch}
    end
    redis.call('HSET', m.rkey, 'status', status, 'destination', dest, 'queue', queue,
      'next_attempt_at', score, 'updated_at', m.created, unpack(ARGV, m.rfirst, m.rlast))
    if #order > 0 then redis.call('HSET', m.rkey, unpack(order)) end
    zadd_once(skey, score, id)
    if due then zadd_once(m.dkey, score, id) end
    zadd_once(m.ckey, m.created, id)
    if due and tonumber(score) <= due_by then wake_queue(m.wkey, queue, now_s, wake_ttl) end
  else
    if m.code == 'new' then m.code = 'refused' end
    others[#others + 1] = {i, m.standing, m.code}
  end
end
local n_payloads = tonumber(ARGV[pos] or '0')
pos = pos + 1
for _ = 1, n_payloads do
  local nrefs = tonumber(ARGV[pos + 2])
  local live = 0
  if not conflict then
    for j = pos + 3, pos + 2 + nrefs do
      if msgs[tonumber(ARGV[j])].code == 'new' then live = live + 1 end
    end
  end
  if live > 0 and redis.call('HINCRBY', KEYS[k], 'refs', live) == live then
    redis.call('HSET', KEYS[k], 'body', ARGV[pos + 1], 'content_type', ARGV[pos])
  end
  k = k + 1
  pos = pos + 3 + nrefs
end
if KEYS[k] and not conflict then  -- outbox:destinations: add the call's destinations
  local names = {}
  for g = 1, n_groups do names[g] = ARGV[10 + 3 * (g - 1)] end
  redis.call('SADD', KEYS[k], unpack(names))
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

--! needs keys writes message
-- What a claim does to the messages it takes, reschedules or leaves, shared by claim.lua
-- (one partition: the gate decided in the same call) and claim_apply.lua (more than one:
-- the gate decided in the destination's home slot, gate.lua). Needs lib/keys.lua,
-- lib/writes.lua and lib/message.lua included before it.
--
-- claim_setup(prefix, now_s, lease, deadline, queue_due_key, quarantine_key, lane, have):
--   the call's inputs; lane 'q' claims from the quarantine index; have: the ids of the
--   events whose payload bodies the caller holds, comma-separated (their records are
--   not read: outbox/store/payload_bodies.py).
-- C.out is the claimed records (flat: record, resend pairs), C.held and C.capped counts;
-- C.payloads the payload records the claimed deliveries of published events reference
-- and the caller does not hold.
local C = {out = {}, taken_ids = {}, taken = 0, held = 0, capped = {}, capped_seen = {}, payloads = {}, payload_seen = {}, have = {}}

local function claim_setup(prefix, now_s, lease, deadline, queue_due_key, quarantine_key, lane, have)
  C.prefix, C.now_s, C.lease, C.deadline = prefix, now_s, lease, deadline
  C.queue_due_key, C.quarantine_key = queue_due_key, quarantine_key
  C.in_quarantine = lane == 'q'
  C.due_key = C.in_quarantine and quarantine_key or queue_due_key
  for event_id in string.gmatch(have or '', '[^,]+') do C.have[event_id] = true end
end

-- status, destination and suspect mark from a flat HGETALL reply
local function status_and_destination(record)
  local status, dest, suspect
  for i = 1, #record, 2 do
    local f = record[i]
    if f == 'status' then status = record[i + 1]
    elseif f == 'destination' then dest = record[i + 1]
    elseif f == 'suspect' then suspect = true end
  end
  return status, dest, suspect
end

-- A pending|retrying message in the wrong lane (a suspect in the due index, a message no
-- longer suspect in the quarantine index) moves to the other one, at its score.
local function wrong_lane(status, suspect)
  return (status == 'pending' or status == 'retrying') and (suspect and true or false) ~= C.in_quarantine
end

local function other_lane(id, score)
  zrem_later(C.due_key, id)
  zadd_later(C.in_quarantine and C.queue_due_key or C.quarantine_key, score, id)
end

local function reschedule(id, status, dest, at)
  local s = string.format('%.6f', at)
  zadd_later(C.due_key, s, id)
  zadd_later(K.status(K.part(C.prefix, id), status, dest), s, id)
  redis.call('HSET', K.resend(C.prefix, id), 'next_attempt_at', s)
  C.held = C.held + 1
end

local function park(id, dest, score)
  zrem_later(C.due_key, id)
  zadd_later(K.parked(K.part(C.prefix, id), dest), score, id)
end

local function cap_reached(dest)
  if not C.capped_seen[dest] then
    C.capped_seen[dest] = true
    C.capped[#C.capped + 1] = dest
  end
end

local function take(id, rkey, record, status, dest)
  zrem_later(C.due_key, id)
  if C.in_quarantine then zrem_later(C.queue_due_key, id) end  -- in both after a "retry now"
  local pp = K.part(C.prefix, id)
  zrem_later(K.status(pp, status, dest), id)
  zadd_later(K.status(pp, 'sending', dest), C.deadline, id)
  local claimed = {'status', 'sending', 'lease', C.lease, 'last_attempt_at', C.now_s, 'updated_at', C.now_s}
  redis.call('HSET', rkey, unpack(claimed))
  local out = C.out
  out[#out + 1] = id  -- replaced by the message record at the end (one MGET)
  C.taken_ids[#C.taken_ids + 1] = #out
  -- The resend record as read before the HSET, with the claim's fields appended: a later
  -- pair wins when the caller makes the flat list a mapping (one HGETALL fewer).
  for i = 1, #record, 2 do
    if record[i] == 'payload' then  -- a delivery of a published event: its body is there
      local pkey = K.payload(pp, record[i + 1])
      if not C.payload_seen[pkey] then
        C.payload_seen[pkey] = true
        if not C.have[record[i + 1]] then C.payloads[#C.payloads + 1] = pkey end
      end
      break
    end
  end
  for _, v in ipairs(claimed) do record[#record + 1] = v end
  out[#out + 1] = record
  C.taken = C.taken + 1
end

-- The score of the first entry of `key` (a declared index), or false when it is empty.
-- pcall: on a slot half-moved by a legacy migration, an index this call emptied (its last
-- entries claimed) no longer exists here, and a read of a missing key of a migrating slot
-- is a non-local key: the script aborted there, after its writes (the messages claimed,
-- the caller told of an error). The key existed here when the call began (a missing
-- declared key answers TRYAGAIN before the script runs), so it is empty: false.
local function first_score(key)
  local first = redis.pcall('ZRANGE', key, 0, 0, 'WITHSCORES')
  if first.err then return false end
  return first[2] or false
end

-- Flush the index writes, read the claimed messages' records (one MGET per chunk) and
-- the bodies of the payload records they reference (one HGET per record: the caller
-- needs no round trip of its own for them), and return the reply: {claimed, next_due,
-- held, capped, next_suspect, payloads}, payloads flat: record key, body (false: gone;
-- a record the script could not read is left out).
local function claim_reply()
  flush_writes()
  local out, taken_ids, prefix = C.out, C.taken_ids, C.prefix
  for first = 1, #taken_ids, WRITE_CHUNK do
    local last = math.min(first + WRITE_CHUNK - 1, #taken_ids)
    local mkeys = {}
    for i = first, last do mkeys[#mkeys + 1] = K.message(prefix, out[taken_ids[i]]) end
    local raws = redis.call('MGET', unpack(mkeys))
    for i = first, last do
      local pos, raw = taken_ids[i], raws[i - first + 1]
      -- false: no such key, or an older version's hash (MGET answers nil for another type)
      if raw then out[pos] = {out[pos], raw} else out[pos] = message_record(K.message(prefix, out[pos]), out[pos]) end
    end
  end
  local payloads = {}
  for _, pkey in ipairs(C.payloads) do
    -- pcall: on a slot half-moved by a legacy migration the record may be on the other
    -- node already (a non-local key): left out, the caller reads it itself (after the
    -- claim's writes, a read that fails must not abort the script)
    local body = redis.pcall('HGET', pkey, 'body')
    if type(body) ~= 'table' then
      payloads[#payloads + 1] = pkey
      payloads[#payloads + 1] = body
    end
  end
  return {out, first_score(C.queue_due_key), C.held, C.capped, first_score(C.quarantine_key), payloads}
end

-- Claim due messages of one queue for delivery: pending|retrying -> sending, with a
-- lease (the visibility timeout), in due order. This compare-and-set is the lock: a
-- message is claimed by one worker at a time.
--
-- Each destination's gate (lib/gate.lua) is read once per call (docs/destinations.md), with
-- the ZCARD of its sending index if it has a MAX_CONCURRENCY and its GCRA TAT if it has a RATE_LIMIT:
-- only this call's claims change those while the script runs, so it counts them in
-- memory, and writes a TAT it moved back once, after the loop:
-- * paused or disabled, or its circuit breaker open before the next probe time: the
--   message is parked (due index -> outbox:parked:<destination>, same score; its status
--   stays pending/retrying) until resume/enable/close puts it back (unpark.lua);
-- * breaker open and the probe due (or half-open with its probe's lease expired): this
--   message is claimed as the one probe (breaker -> half_open);
-- * blocked_until (a Retry-After) in the future, or ended less than RAMP_WINDOW ago: the
--   messages held by the block are released gradually after it, not all at its end (which
--   sent up to every worker's in-flight cap at a receiver that had just said it was
--   overloaded, and tripped its breaker). A slow start, as TCP's after a loss (RFC 5681,
--   3.1: a sender that does not know the path's capacity starts with a small window and
--   doubles it every round trip): the k-th message held (k = 0, 1, ..., counted per
--   block in the destination's hash: ramp_of, ramp_k) is due at
--       blocked_until + RAMP_STEP * log2(1 + k / first)
--   so `first` messages go in the first RAMP_STEP after the block, twice as many in the
--   next, and so on (10,000 held are all due within 12 steps). `first` is RAMP_FIRST, or
--   the destination's RATE_LIMIT per RAMP_STEP when that is more (its GCRA spaces them
--   already). A message is held when its due score is before blocked_until (it waited
--   through the block, or is a retry the 429/503 itself scheduled); one due at or after
--   it has its slot (or is new traffic) and is not claimed before its score, even within
--   the claim's due slack;
-- * MAX_CONCURRENCY leases of the destination held (ZCARD of its sending index): rescheduled
--   a moment later; over its RATE_LIMIT: rescheduled to when GCRA allows it, successive
--   ones spaced by the emission interval. GCRA, the generic cell rate algorithm (ITU-T
--   I.371; as described by Brandur Leach, "Rate Limiting, Cells, and GCRA", 2015, and
--   implemented by redis-cell): one theoretical arrival time (TAT) per destination; an
--   attempt at `now` is allowed if now >= TAT - tau, and then TAT = max(TAT, now) + T.
-- A rescheduled message keeps its retry count: no attempt was made.
--
-- KEYS[1] the queue's due index (outbox:due:<queue>)
-- KEYS[2] the queue's quarantine index (outbox:quarantine:<queue>)
-- KEYS[3] outbox:probes
-- ARGV: named (lib/args.lua):
--   prefix: of the keys found at run time (lib/keys.lua: each message's records, each
--     destination's state, sending index, parked set and GCRA TAT)
--   now: epoch seconds (string)       queue: the queue's name
--   lease: lease token                deadline: lease deadline (epoch seconds; the
--                                     message's score in the sending index)
--   limit: most messages to claim
--   scan: most due index entries to look at (claims may skip some, see caps)
--   caps: JSON object destination -> most messages of it this call may claim
--     (a destination at its cap is skipped, its messages stay due); "{}" = no caps
--   slack: due slack (seconds): messages due by now + slack are taken
--   limits: JSON object destination -> [emission interval T (0 = no rate limit),
--     tolerance tau, max concurrency (0 = none)]; "{}" = no limits
--   lane: "q": the quarantine lane: claim from the quarantine index instead of the
--     due index (the caller asks for one message, with nothing else in flight).
--     Otherwise a suspect (its resend record has 'suspect': taken back from a lost
--     worker, docs/architecture.md) met in the due index is moved to the quarantine
--     index at the same score, not claimed: it is attempted alone, never in a batch.
-- Returns {claimed, next_due, held, capped}: claimed is a flat list of the message record
-- ({id, record}: lib/message.lua) and resend HGETALL (read before the claim, the claim's
-- own fields appended: later pairs win) per claimed message; next_due is the score of
-- the earliest entry left in the due index (a string), or false when it is empty; held
-- counts messages rescheduled by a limit (the caller may wait for them rather than end
-- its run); capped lists the destinations whose due entries were skipped at their cap
-- (caps), each once: until an attempt of one of them finishes, a claim of the same
-- head of the queue would read the same entries again and take nothing (the caller
-- waits instead: outbox/delivery.py); next_suspect is the score of the earliest entry of
-- the quarantine index (a string), or false.
-- Index writes and the message reads are made once per index for the whole call
-- (lib/writes.lua, MGET): a claim of N messages costs two commands per message (the
-- resend record's HGETALL and HSET) and a few per call.
--! include args
--! include keys
--! include message
--! include writes
--! include gate
local opts = named_args()
local prefix, now_s, queue, lease, deadline = K.setup(opts), opts.now, opts.queue, opts.lease, opts.deadline
local now = tonumber(now_s)
local limit, scan = tonumber(opts.limit), tonumber(opts.scan)
local queue_due_key, quarantine_key, probes_key = KEYS[1], KEYS[2], KEYS[3]
local in_quarantine = opts.lane == 'q'
local due_key = in_quarantine and quarantine_key or queue_due_key
local out = {}
local taken_ids = {}  -- positions in out of the claimed ids, whose records are read at the end
local taken, held = 0, 0
local capped, capped_seen = {}, {}

-- MAX_CONCURRENCY counts the leases held in every partition's sending index
local function count_sending(dest)
  local n = 0
  for k = 0, K.parts - 1 do n = n + redis.call('ZCARD', K.status(K.partition(prefix, k), 'sending', dest)) end
  return n
end
gate_setup(prefix, now_s, deadline, cjson.decode(opts.limits or '{}'), cjson.decode(opts.caps), count_sending)

local function reschedule(id, status, dest, at)
  local s = string.format('%.6f', at)
  zadd_later(due_key, s, id)
  zadd_later(K.status(K.part(prefix, id), status, dest), s, id)
  redis.call('HSET', K.resend(prefix, id), 'next_attempt_at', s)
  held = held + 1
end

local function take(id, rkey, record, status, dest)
  zrem_later(due_key, id)
  if in_quarantine then zrem_later(queue_due_key, id) end  -- in both after a "retry now"
  local pp = K.part(prefix, id)
  zrem_later(K.status(pp, status, dest), id)
  zadd_later(K.status(pp, 'sending', dest), deadline, id)
  local claimed = {'status', 'sending', 'lease', lease, 'last_attempt_at', now_s, 'updated_at', now_s}
  redis.call('HSET', rkey, unpack(claimed))
  out[#out + 1] = id  -- replaced by the message record after the loop (one MGET)
  taken_ids[#taken_ids + 1] = #out
  -- The resend record as read before the HSET, with the claim's fields appended: a later
  -- pair wins when the caller makes the flat list a mapping (one HGETALL fewer).
  for _, v in ipairs(claimed) do record[#record + 1] = v end
  out[#out + 1] = record
  taken = taken + 1
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

if limit > 0 then
  local rows = redis.call('ZRANGEBYSCORE', due_key, '-inf', now + tonumber(opts.slack), 'WITHSCORES', 'LIMIT', 0, scan)
  write_at_once(#rows == 2)
  for i = 1, #rows, 2 do
    if taken >= limit then break end
    local id, score = rows[i], rows[i + 1]
    local rkey = K.resend(prefix, id)
    local record = redis.call('HGETALL', rkey)
    local status, dest, suspect = status_and_destination(record)
    if (status == 'pending' or status == 'retrying') and (suspect and true or false) ~= in_quarantine then
      -- a suspect in the due index goes to the quarantine lane; an entry of the
      -- quarantine index that is no suspect (any more) goes back to the due index
      zrem_later(due_key, id)
      zadd_later(in_quarantine and queue_due_key or quarantine_key, score, id)
    elseif status == 'pending' or status == 'retrying' then
      local action, at = gate_decide(dest, score)
      if action == 'park' then
        zrem_later(due_key, id)
        zadd_later(K.parked(K.part(prefix, id), dest), score, id)
      elseif action == 'probe' then
        take(id, rkey, record, status, dest)
        gate_probe(dest, id)
        redis.call('ZADD', probes_key, deadline, dest)
      elseif action == 'later' then
        reschedule(id, status, dest, at)
      elseif action == 'hold' then
        held = held + 1
      elseif action == 'cap' then
        if not capped_seen[dest] then
          capped_seen[dest] = true
          capped[#capped + 1] = dest
        end
      else
        take(id, rkey, record, status, dest)
      end
    else
      -- A stale entry (the message moved on or was deleted): repair the index.
      zrem_later(due_key, id)
    end
  end
end
gate_flush()
flush_writes()
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
local function first_score(key)
  local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  return first[2] or false
end
local next_due = first_score(queue_due_key)
local next_suspect = first_score(quarantine_key)
return {out, next_due, held, capped, next_suspect}

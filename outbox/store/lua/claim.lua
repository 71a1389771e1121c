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
--   the claim's due slack. Within the window every claim is also paced at the release's
--   rate (one GCRA, as below, with a burst of RAMP_FIRST and the interval of the slots'
--   rate at `now`; its TAT is ramp_tat), so a claim that comes late does not take every
--   slot that passed at once;
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
--     (a destination at its cap is skipped, its messages stay due); "{}" = no caps;
--     the entry "*" is the cap of each destination not named (every endpoint the
--     worker has nothing in flight of), so the object does not grow with endpoints
--   slack: due slack (seconds): messages due by now + slack are taken
--   limits: JSON object destination -> [emission interval T (0 = no rate limit),
--     tolerance tau, max concurrency (0 = none)]; "{}" = no limits
--   lane: "q": the quarantine lane: claim from the quarantine index instead of the
--     due index (the caller asks for one message, with nothing else in flight).
--     Otherwise a suspect (its resend record has 'suspect': taken back from a lost
--     worker, docs/architecture.md) met in the due index is moved to the quarantine
--     index at the same score, not claimed: it is attempted alone, never in a batch.
--   have (optional): ids of the events whose payload bodies the caller holds,
--     comma-separated: their records are not read again (lib/claimed.lua)
-- Returns {claimed, next_due, held, capped, next_suspect, payloads, states}: claimed is a flat
-- list of the message record ({id, record}: lib/message.lua) and resend HGETALL (read before the claim, the claim's
-- own fields appended: later pairs win) per claimed message; next_due is the score of
-- the earliest entry left in the due index (a string), or false when it is empty; held
-- counts messages rescheduled by a limit (the caller may wait for them rather than end
-- its run); capped lists the destinations whose due entries were skipped at their cap
-- (caps), each once: until an attempt of one of them finishes, a claim of the same
-- head of the queue would read the same entries again and take nothing (the caller
-- waits instead: outbox/delivery.py); next_suspect is the score of the earliest entry of
-- the quarantine index (a string), or false; payloads is flat: per payload record the
-- claimed deliveries of published events reference (lib/keys.lua K.payload, in this
-- partition), its key and its body (false: the record is gone), so the caller reads no
-- payload in a round trip of its own; states is flat: per endpoint the call gated, its
-- name, admin state, its reason and limits as its state hash holds them (lib/gate.lua
-- gate_states: read by the gate's HMGET, no command more).
-- Index writes and the message reads are made once per index for the whole call
-- (lib/writes.lua, MGET): a claim of N messages costs two commands per message (the
-- resend record's HGETALL and HSET), one HGET per payload record, and a few per call.
--! include args
--! include keys
--! include message
--! include writes
--! include gate
--! include claimed
local opts = named_args()
local prefix, now_s, deadline = K.setup(opts), opts.now, opts.deadline
local now = tonumber(now_s)
local limit, scan = tonumber(opts.limit), tonumber(opts.scan)
local probes_key = KEYS[3]
claim_setup(prefix, now_s, opts.lease, deadline, KEYS[1], KEYS[2], opts.lane, opts.have)

-- MAX_CONCURRENCY counts the leases held in every partition's sending index
local function count_sending(dest)
  local n = 0
  for k = 0, K.parts - 1 do n = n + redis.call('ZCARD', K.status(K.partition(prefix, k), 'sending', dest)) end
  return n
end
gate_setup(prefix, now_s, deadline, cjson.decode(opts.limits or '{}'), cjson.decode(opts.caps), count_sending)

if limit > 0 then
  local rows = redis.call('ZRANGEBYSCORE', C.due_key, '-inf', now + tonumber(opts.slack), 'WITHSCORES', 'LIMIT', 0, scan)
  write_at_once(#rows == 2)
  for i = 1, #rows, 2 do
    if C.taken >= limit then break end
    local id, score = rows[i], rows[i + 1]
    local rkey = K.resend(prefix, id)
    local record = redis.call('HGETALL', rkey)
    local status, dest, suspect = status_and_destination(record)
    if wrong_lane(status, suspect) then
      other_lane(id, score)
    elseif status == 'pending' or status == 'retrying' then
      local action, at = gate_decide(dest, score)
      if action == 'park' then
        park(id, dest, score)
      elseif action == 'probe' then
        take(id, rkey, record, status, dest)
        gate_probe(dest, id)
        redis.call('ZADD', probes_key, deadline, dest)
      elseif action == 'later' then
        reschedule(id, status, dest, at)
      elseif action == 'hold' then
        C.held = C.held + 1
      elseif action == 'cap' then
        cap_reached(dest)
      else
        take(id, rkey, record, status, dest)
      end
    else
      zrem_later(C.due_key, id)  -- a stale entry (the message moved on or was deleted): repair
    end
  end
end
gate_flush()
local reply = claim_reply()
reply[#reply + 1] = gate_states()
return reply

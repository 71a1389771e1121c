-- The second step of a claim with more than one partition, in one destination's home
-- slot: its gate (lib/gate.lua) answers, for each due message of it that a pick found
-- (pick.lua), what the claim may do, and grants the attempts it lets go: each taken
-- message (and probe) is added to the destination's in-flight set (outbox:inflight:<d>,
-- "<lease>|<id>" -> lease deadline: two workers may both be granted one message, and the
-- one whose claim loses gives its own grant back, not the winner's), which its
-- MAX_CONCURRENCY counts, after dropping the entries
-- whose lease ended (a worker that died frees its grant when its lease would have).
-- An entry leaves the set when its attempt's outcome is recorded (health.lua), or when
-- the claim could not use it (the message moved on: claim_apply.lua reports it, the
-- caller removes it). While granted and not yet used, an entry holds a concurrency slot:
-- a limit is never exceeded, it can only be under-used for one round trip. A GCRA slot
-- taken for a message the claim could not use is not given back (the rate is at most
-- met, never exceeded).
--
-- KEYS[1] the destination's state hash  KEYS[2] its GCRA TAT  KEYS[3] its in-flight set
-- ARGV: named (lib/args.lua): prefix, parts, destination, now (epoch s), lease (the
--   claim's lease token), deadline (the lease deadline), limits (JSON: as claim.lua's, for this destination), cap (most it
--   may take, "" = no cap); then per candidate: id, score
-- Returns, per candidate, flat: action ("take", "probe", "park", "later", "hold",
--   "cap"), at ("" unless later); then, last, the destination's state as lib/gate.lua's
--   gate_states gives it (empty unless it is an endpoint).
--! include args
--! include keys
--! include gate
local opts, pos = named_args()
local prefix, dest, now_s = K.setup(opts), opts.destination, opts.now
local now = tonumber(now_s)
local inflight = KEYS[3]
-- The grants whose lease has not ended are counted (ZCOUNT) and the others dropped last,
-- after this call's grants are added: dropped first, they could empty the set (every
-- grant lapsed), and on a slot held half-moved by a legacy migration a key that no
-- longer exists is a non-local key: counting it, or adding a grant (creating it again),
-- aborted the script (the exchange raised it as a bug).
local lapsed = false
local function count_sending()
  lapsed = true
  return redis.call('ZCOUNT', inflight, now_s, '+inf')
end
local caps = {}
if opts.cap ~= '' then caps[dest] = tonumber(opts.cap) end
gate_setup(prefix, now_s, opts.deadline, cjson.decode(opts.limits), caps, count_sending)
local out = {}
for i = pos, #ARGV, 2 do
  local id, score = ARGV[i], ARGV[i + 1]
  local action, at = gate_decide(dest, score)
  if action == 'take' or action == 'probe' then
    redis.call('ZADD', inflight, opts.deadline, K.inflight_member(opts.lease, id))
    if action == 'probe' then gate_probe(dest, id) end
  end
  out[#out + 1] = action
  out[#out + 1] = at and string.format('%.6f', at) or ''
end
gate_flush()
if lapsed then redis.call('ZREMRANGEBYSCORE', inflight, '-inf', '(' .. now_s) end
out[#out + 1] = gate_states()
return out

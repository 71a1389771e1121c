-- The last step of a claim with more than one partition, in the partition's slot: the
-- answers of the destinations' gates (gate.lua) applied to the messages a pick found
-- (pick.lua), each only if it is still where the pick saw it (pending or retrying, in
-- the lane's index): take (pending|retrying -> sending with this lease, lib/claimed.lua),
-- probe (the same; the caller registers the probe), park, later (rescheduled), hold,
-- cap, quarantine (a suspect met in the due index, or the reverse: other lane) and stale
-- (the entry of a message that moved on or is gone: removed).
--
-- KEYS[1] the queue's due index in the partition  KEYS[2] its quarantine index
-- ARGV: named (lib/args.lua): prefix, parts, now, lease, deadline, lane, have (as
--   claim.lua's); then per
--   message: id, action, at ("" unless later)
-- Returns {claimed, next_due, held, capped, next_suspect, payloads, unused}: as
--   claim.lua's, and
--   unused: the ids granted (take, probe) that could not be claimed (their gate's grant
--   is given back by the caller).
--! include args
--! include keys
--! include message
--! include writes
--! include claimed
local opts, pos = named_args()
local prefix, now_s = K.setup(opts), opts.now
claim_setup(prefix, now_s, opts.lease, opts.deadline, KEYS[1], KEYS[2], opts.lane, opts.have)
local unused = {}
write_at_once(#ARGV - pos + 1 <= 3)
for i = pos, #ARGV, 3 do
  local id, action, at = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local rkey = K.resend(prefix, id)
  local score = redis.call('ZSCORE', C.due_key, id)
  local record = redis.call('HGETALL', rkey)
  local status, dest, suspect = status_and_destination(record)
  local waiting = score and (status == 'pending' or status == 'retrying')
  if action == 'stale' then
    if score and not waiting then zrem_later(C.due_key, id) end
  elseif not waiting then
    if action == 'take' or action == 'probe' then unused[#unused + 1] = id end
    if score then zrem_later(C.due_key, id) end
  elseif wrong_lane(status, suspect) then
    if action == 'take' or action == 'probe' then unused[#unused + 1] = id end
    other_lane(id, score)
  elseif action == 'take' or action == 'probe' then
    take(id, rkey, record, status, dest)
  elseif action == 'park' then
    park(id, dest, score)
  elseif action == 'later' then
    reschedule(id, status, dest, tonumber(at))
  elseif action == 'hold' then
    C.held = C.held + 1
  elseif action == 'cap' then
    cap_reached(dest)
  end
end
local reply = claim_reply()
reply[7] = unused
return reply

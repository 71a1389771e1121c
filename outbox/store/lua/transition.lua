-- Compare-and-set status transitions, many messages per call. This is the lock
-- against double processing: a change applies only if the message is in one of the
-- expected statuses (and, if asked, its lease matches and it is due). It keeps the
-- destination's status indexes and the queue's due index (pending|retrying, by due
-- time) in step.
--
-- ARGV[1] prefix
-- ARGV[2] now (epoch seconds, string)
-- ARGV[3] attempts kept per message
-- ARGV[4] Pub/Sub channel for events ("" = publish nothing; nothing is published either
--         while the channel has no subscriber, PUBSUB NUMSUB, and no pattern subscription)
-- ARGV[5] number of changes; from ARGV[6], each change as flat strings ("" = absent):
--   id, from (statuses joined by ","), to, score, lease (must match), due_by
--   (next_attempt_at must be <= this epoch time), attempt (JSON pushed on the attempts
--   list), event (JSON published), stat (outcome counted per minute), load ("1": return
--   both records), also (a second event published, e.g. message.exhausted), park (JSON
--   {"to", "score", "set", "unset", "attempt", "event"}, all given: applied instead of
--   the fields above when the message's destination is paused, disabled or its circuit
--   breaker not closed (health.lua, run just before, may have opened it): the message waits in
--   outbox:parked:<destination> (not its due index) with no retry charged,
--   docs/destinations.md), n_set, n_unset, n_inline, then n_set field/value pairs to
--   HSET, n_unset fields to HDEL (passed as ranges of ARGV, in C: the script decodes no
--   JSON but a park alternative that applies) and n_inline pairs: the attempt (a
--   success) as resend-record fields, written instead of pushing it on the attempts
--   list when the record holds no inline success yet (no 'ok_at'): a message delivered
--   at its first attempt gets no attempts list (about 340 bytes less).
-- A message that leaves pending|retrying leaves the parked set of its destination too.
-- Returns, per change: {applied 0|1 (2: applied as its park alternative), status after ("" if no such message)
--                       [, message record ({id, record}: lib/message.lua), resend
--                       HGETALL when load and applied]}
-- Index writes are gathered and made once per index for the whole call
-- (lib/writes.lua).
--! include message
--! include writes
--! include move
local prefix = ARGV[1]
local now = tonumber(ARGV[2])
local kept = tonumber(ARGV[3])
local channel = ARGV[4]
if channel ~= '' and redis.call('PUBSUB', 'NUMSUB', channel)[2] == 0 and redis.call('PUBSUB', 'NUMPAT') == 0 then
  channel = ''  -- nobody listens: Pub/Sub keeps nothing, so a PUBLISH would change nothing
end
local n = tonumber(ARGV[5])
write_at_once(n == 1)
local minute = math.floor(now / 60)
local out = {}
local stats = {}  -- outcome -> count, written once per call
local held = {}   -- destination -> true when paused, disabled or its breaker not closed
local function holds(dest)
  if held[dest] == nil then
    local v = redis.call('HMGET', prefix .. ':dest:' .. dest, 'admin', 'breaker')
    held[dest] = (v[1] == 'paused' or v[1] == 'disabled' or v[2] == 'open' or v[2] == 'half_open')
  end
  return held[dest]
end
local function opt(v) if v == '' then return nil end return v end
local pos = 6
for i = 1, n do
  local id, from, to, score = ARGV[pos], ARGV[pos + 1], ARGV[pos + 2], ARGV[pos + 3]
  local lease, due_by, attempt, event = opt(ARGV[pos + 4]), opt(ARGV[pos + 5]), opt(ARGV[pos + 6]), opt(ARGV[pos + 7])
  local stat, load, also, park = opt(ARGV[pos + 8]), ARGV[pos + 9] == '1', opt(ARGV[pos + 10]), opt(ARGV[pos + 11])
  local nset, nunset, ninline = tonumber(ARGV[pos + 12]), tonumber(ARGV[pos + 13]), tonumber(ARGV[pos + 14])
  local set_first = pos + 15
  local unset_first = set_first + 2 * nset
  local inline_first = unset_first + nunset
  pos = inline_first + 2 * ninline
  local rkey = prefix .. ':resend:' .. id
  local cur = redis.call('HMGET', rkey, 'status', 'destination', 'next_attempt_at', 'lease', 'queue', 'ok_at')
  local status = cur[1]
  local applied = 0
  if status then
    local allowed = string.find(',' .. from .. ',', ',' .. status .. ',', 1, true) ~= nil
    if allowed and due_by and cur[3] and tonumber(cur[3]) > tonumber(due_by) then allowed = false end
    if allowed and lease and lease ~= cur[4] then allowed = false end
    local dest = cur[2] or ''
    local parking = false
    local fields = {'status', to, 'updated_at', ARGV[2]}
    local unset = nil
    if allowed and park and holds(dest) then
      -- the park alternative replaces the outcome's fields (decoded only here)
      parking = true
      park = cjson.decode(park)
      to, score, attempt, event, stat = park.to, park.score, park.attempt, park.event, 'parked'
      fields[2] = to
      for k, v in pairs(park.set) do
        fields[#fields + 1] = k
        fields[#fields + 1] = v
      end
      unset = park.unset
    elseif allowed then
      for j = set_first, unset_first - 1 do fields[#fields + 1] = ARGV[j] end
      if ninline > 0 and not cur[6] then
        for j = inline_first, pos - 1 do fields[#fields + 1] = ARGV[j] end
        attempt = nil  -- kept in the record instead of on the list
      end
    end
    if allowed then
      applied = 1
      move_indexes(prefix, id, dest, cur[5] or '', status, to, score, parking)
      redis.call('HSET', rkey, unpack(fields))
      if parking then
        if unset and #unset > 0 then redis.call('HDEL', rkey, unpack(unset)) end
      elseif nunset > 0 then
        redis.call('HDEL', rkey, unpack(ARGV, unset_first, inline_first - 1))
      end
      if attempt then
        local akey = prefix .. ':attempts:' .. id
        if redis.call('LPUSH', akey, attempt) > kept then redis.call('LTRIM', akey, 0, kept - 1) end
      end
      if stat then stats[stat] = (stats[stat] or 0) + 1 end
      if event and channel ~= '' then redis.call('PUBLISH', channel, event) end
      if also and not parking and channel ~= '' then redis.call('PUBLISH', channel, also) end
      status = to
      if parking then applied = 2 end
    end
  end
  local row = {applied, status or ''}
  if applied > 0 and load then
    row[3] = message_record(prefix, id)
    row[4] = redis.call('HGETALL', rkey)
  end
  out[i] = row
end
flush_writes()
for stat, n in pairs(stats) do
  local skey = prefix .. ':stats:' .. stat .. ':' .. minute
  redis.call('INCRBY', skey, n)
  redis.call('EXPIRE', skey, 7200)
end
return out

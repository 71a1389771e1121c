-- Compare-and-set status transitions, many messages per call. This is the lock
-- against double processing: a change applies only if the message is in one of the
-- expected statuses (and, if asked, its lease matches and it is due). It keeps the
-- destination's status indexes and the queue's due index (pending|retrying, by due
-- time) in step.
--
-- KEYS: per change, in order: the message's resend record, its attempts list, its message
--   record
-- ARGV: named (lib/args.lua): prefix (of the keys found at run time: lib/keys.lua, the
--   message's indexes, its destination's state, the stats counters), now (epoch
--   seconds, string), kept (attempts kept per message), channel (Pub/Sub channel for
--   events; "" = publish nothing; nothing is published either while the channel has no
--   subscriber, PUBSUB NUMSUB, and no pattern subscription, when numsub is "1"; on a
--   cluster it is "0": NUMSUB counts one node's subscribers), n (number of changes),
--   holding (with more than one partition: a JSON list of the destinations that hold
--   their messages; their state hashes are in other slots),
--   fields (the names of each change's fields below, comma-separated);
-- then each change as flat strings named by fields (lib/args.lua row_at; "" = absent):
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
-- An ordered message (okey in its resend record; lib/ordering.lua) that succeeds, or is
-- cancelled, leaves its key, and the next message of the key becomes its head; one that
-- becomes a dead letter blocks its key, or with its change's oskip "1" (the destination's
-- ORDERING policy "skip") leaves it too. Named argument okttl: seconds an ordering key's
-- state is kept after its last message left. A change's okey and dest (the message's
-- ordering key and destination, "" when not known) let the script read the record of the
-- key's next message before it writes anything (see below).
-- A change that does not apply now but carries an attempt is checked for an earlier
-- call of its own (the same change sent again after its reply was lost, or after a later
-- step of a worker's exchange failed): when the message's record holds its attempt
-- already (its inline fields, or its attempt JSON, or its park alternative's, on the
-- attempts list), it was applied then, and the row says so (3, or 4 as its park
-- alternative) with nothing written now.
-- Returns, per change: {applied 0|1 (2: applied as its park alternative; 3: applied by an
--                       earlier call, 4: by an earlier call as its park alternative),
--                       status after ("" if no such message),
--                       promoted: the queue of the next message of its ordering key when
--                       this change made that message the key's head ("" otherwise; the
--                       caller wakes that queue: it may not be the one being worked)
--                       [, message record ({id, record}: lib/message.lua), resend
--                       HGETALL when load and applied now]}
-- Index writes are gathered and made once per index for the whole call
-- (lib/writes.lua).
--! include args
--! include keys
--! include message
--! include writes
--! include move
--! include guard
--! include join
--! include ordering
local opts, pos = named_args()
local prefix = K.setup(opts)
local now = tonumber(opts.now)
local kept = tonumber(opts.kept)
local okttl = tonumber(opts.okttl or '604800')
local channel = opts.channel
if channel ~= '' and opts.numsub == '1' and redis.call('PUBSUB', 'NUMSUB', channel)[2] == 0
    and redis.call('PUBSUB', 'NUMPAT') == 0 then
  channel = ''  -- nobody listens: Pub/Sub keeps nothing, so a PUBLISH would change nothing
end
local n = tonumber(opts.n)
local FIELDS = split(opts.fields)
write_at_once(n == 1)
local minute = math.floor(now / 60)
local out = {}
local stats = {}  -- stats key (outcome, its partition) -> count, written once per call
local held = {}   -- destination -> true when paused, disabled or its breaker not closed
if K.parts > 1 then
  -- the destinations' state is in their home slots: the caller says which hold
  -- (health.lua's reply, run before), the others do not
  for _, dest in ipairs(cjson.decode(opts.holding or '[]')) do held[dest] = true end
end
local function holds(dest)
  if held[dest] == nil and K.parts > 1 then held[dest] = false end
  if held[dest] == nil then
    local v = redis.call('HMGET', K.dest(prefix, dest), 'admin', 'breaker')
    held[dest] = (v[1] == 'paused' or v[1] == 'disabled' or v[2] == 'open' or v[2] == 'half_open')
  end
  return held[dest]
end
local function opt(v) if v == '' then return nil end return v end
-- 3 (4: as its park alternative) when the record (rkey, akey) already holds this change's
-- attempt: its inline pairs ARGV[first..last], its attempt JSON or its park's on the
-- list; else 0. Attempt records name their start time and worker: no other attempt's match.
local function written_before(rkey, akey, attempt, park, first, last)
  if last > first then
    local names, values = {}, {}
    for j = first, last, 2 do
      names[#names + 1] = ARGV[j]
      values[#values + 1] = ARGV[j + 1]
    end
    local got = redis.call('HMGET', rkey, unpack(names))
    local same = true
    for k = 1, #names do
      if got[k] ~= values[k] then same = false break end
    end
    if same then return 3 end
  end
  if attempt and redis.call('LPOS', akey, attempt) then return 3 end
  if park then
    local parked = cjson.decode(park).attempt
    if parked and redis.call('LPOS', akey, parked) then return 4 end
  end
  return 0
end
-- Before any write: the record of the message behind each ordered message's head (the
-- change's okey and its destination, dest, given by the caller) and the indexes its
-- promotion writes are checked (heirs_here, lib/ordering.lua), so that a slot held
-- half-moved by a legacy migration (that record moved, the declared keys not yet)
-- answers TRYAGAIN with nothing written, as a declared key would, instead of the script
-- aborting after the head's writes with its next message left waiting for ever.
-- The fields are read where they are (no row table: building one per change here cost
-- every transition, ordered or not, about a fifth more time; docs/benchmarks.md).
do
  local at = {}
  for i, name in ipairs(FIELDS) do at[name] = i - 1 end
  local p = pos
  for _ = 1, n do
    local okey, dest = ARGV[p + at.okey], ARGV[p + at.dest]
    if okey ~= '' and dest ~= '' then
      local id = ARGV[p + at.id]
      local q = K.order(K.part(prefix, id), dest, okey)
      if order_next(q, id) then
        local refused = heirs_here(prefix, KEYS[1], {[q] = 1})
        if refused then return refused end
      end
    end
    p = p + #FIELDS + 2 * tonumber(ARGV[p + at.n_set]) + tonumber(ARGV[p + at.n_unset])
      + 2 * tonumber(ARGV[p + at.n_inline])
  end
end
for i = 1, n do
  local c = row_at(FIELDS, pos)
  local id, from, to, score = c.id, c.from, c.to, c.score
  local lease, due_by, attempt, event = opt(c.lease), opt(c.due_by), opt(c.attempt), opt(c.event)
  local stat, load, also, park = opt(c.stat), c.load == '1', opt(c.also), opt(c.park)
  local nset, nunset, ninline = tonumber(c.n_set), tonumber(c.n_unset), tonumber(c.n_inline)
  local set_first = pos + #FIELDS
  local unset_first = set_first + 2 * nset
  local inline_first = unset_first + nunset
  pos = inline_first + 2 * ninline
  local rkey, akey, mkey = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i]
  local cur = redis.call('HMGET', rkey, 'status', 'destination', 'next_attempt_at', 'lease', 'queue', 'ok_at',
    'okey', 'oseq')
  local status = cur[1]
  local applied = 0
  local promoted = nil  -- the queue of the key's next message, when it became its head
  if status then
    local allowed = string.find(',' .. from .. ',', ',' .. status .. ',', 1, true) ~= nil
    if allowed and due_by and cur[3] and tonumber(cur[3]) > tonumber(due_by) then allowed = false end
    if allowed and lease and lease ~= cur[4] then allowed = false end
    local dest = cur[2] or ''
    local parking = false
    local fields = {'status', to, 'updated_at', opts.now}
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
        if redis.call('LPUSH', akey, attempt) > kept then redis.call('LTRIM', akey, 0, kept - 1) end
      end
      local okey = cur[7]
      if okey and not parking and to ~= status then
        local pp = K.part(prefix, id)
        if to == 'succeeded' then
          promoted = order_leave(prefix, pp, dest, okey, id, cur[8], okttl, opts.now)
        elseif to == 'cancelled' or (to == 'failed' and c.oskip == '1') then
          promoted = order_leave(prefix, pp, dest, okey, id, nil, okttl, opts.now)
        elseif to == 'failed' then
          order_block(pp, dest, okey, id, opts.now)
        end
      end
      if stat then
        local skey = K.stats(K.part(prefix, id), stat, minute)
        stats[skey] = (stats[skey] or 0) + 1
      end
      if event and channel ~= '' then redis.call('PUBLISH', channel, event) end
      if also and not parking and channel ~= '' then redis.call('PUBLISH', channel, also) end
      status = to
      if parking then applied = 2 end
    end
  end
  if applied == 0 and status and (attempt or park or ninline > 0) then
    applied = written_before(rkey, akey, attempt, park, inline_first, pos - 1)
  end
  local row = {applied, status or '', promoted or ''}
  if (applied == 1 or applied == 2) and load then
    row[4] = message_record(mkey, id)
    row[5] = redis.call('HGETALL', rkey)
  end
  out[i] = row
end
flush_writes()
-- A minute's outcome counter is kept 2 h after the minute's end (seconds from now, so a
-- worker's clock apart from the server's moves it no further), its time to live given
-- once, when the INCRBY made it (it answers its own increment: the counters only grow),
-- not again by every call that counts in that minute (an EXPIRE per call before).
local keep = math.ceil((minute + 1) * 60 + 7200 - now)
for skey, n in pairs(stats) do
  if redis.call('INCRBY', skey, n) == n then redis.call('EXPIRE', skey, keep) end
end
return out

-- Compare-and-set status transitions, many messages per call. This is the lock
-- against double processing: a change applies only if the message is in one of the
-- expected statuses (and, if asked, its lease matches and it is due). It keeps the
-- status indexes and the queue's due index (pending|retrying, by due time) in step.
--
-- ARGV[1] prefix
-- ARGV[2] now (epoch seconds, string)
-- ARGV[3] attempts kept per message
-- ARGV[4] Pub/Sub channel for events ("" = publish nothing; nothing is published either
--         while the channel has no subscriber, PUBSUB NUMSUB, and no pattern subscription)
-- ARGV[5] JSON list of changes, each:
--   {"id": str, "from": [statuses], "to": status, "score": str,
--    "set": {field: str}, "unset": [field], "lease": str (must match),
--    "due_by": str (next_attempt_at must be <= this epoch time),
--    "attempt": str (JSON pushed on the attempts list), "event": str (published),
--    "stat": str (outcome counted per minute), "load": bool (return both records),
--    "also": str (a second event published, e.g. message.exhausted),
--    "park": {"to", "score", "set", "unset", "attempt", "event"}: applied instead of
--    the fields above when the message's destination is paused, disabled or its
--    circuit breaker not closed (health.lua, run just before, may have opened it): the
--    message waits in outbox:parked:<destination> (not its due index) with no retry
--    charged (docs/destinations.md)}
-- A message that leaves pending|retrying leaves the parked set of its destination too.
-- Returns, per change: {applied 0|1 (2: applied as its park alternative), status after ("" if no such message)
--                       [, message HGETALL, resend HGETALL when load and applied]}
local prefix = ARGV[1]
local now = tonumber(ARGV[2])
local kept = tonumber(ARGV[3])
local channel = ARGV[4]
if channel ~= '' and redis.call('PUBSUB', 'NUMSUB', channel)[2] == 0 and redis.call('PUBSUB', 'NUMPAT') == 0 then
  channel = ''  -- nobody listens: Pub/Sub keeps nothing, so a PUBLISH would change nothing
end
local changes = cjson.decode(ARGV[5])
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
for i, c in ipairs(changes) do
  local rkey = prefix .. ':resend:' .. c.id
  local cur = redis.call('HMGET', rkey, 'status', 'destination', 'next_attempt_at', 'lease', 'queue')
  local status = cur[1]
  local applied = 0
  if status then
    local allowed = false
    for _, s in ipairs(c.from) do
      if s == status then allowed = true end
    end
    if allowed and c.due_by and cur[3] and tonumber(cur[3]) > tonumber(c.due_by) then allowed = false end
    if allowed and c.lease and c.lease ~= cur[4] then allowed = false end
    local dest = cur[2] or ''
    local parking = false
    if allowed and c.park and holds(dest) then
      parking = true
      for k, v in pairs(c.park) do c[k] = v end
      if c.park.unset == nil then c.unset = nil end
      c.stat = 'parked'
    end
    if allowed then
      applied = 1
      redis.call('ZREM', prefix .. ':status:' .. status, c.id)
      redis.call('ZREM', prefix .. ':status:' .. status .. ':dest:' .. dest, c.id)
      redis.call('ZADD', prefix .. ':status:' .. c.to, c.score, c.id)
      redis.call('ZADD', prefix .. ':status:' .. c.to .. ':dest:' .. dest, c.score, c.id)
      -- The due index of the message's queue holds exactly its pending|retrying messages.
      local due_key = prefix .. ':due:' .. (cur[5] or '')
      if status == 'pending' or status == 'retrying' then redis.call('ZREM', prefix .. ':parked:' .. dest, c.id) end
      if parking then
        redis.call('ZADD', prefix .. ':parked:' .. dest, c.score, c.id)
      elseif c.to == 'pending' or c.to == 'retrying' then
        redis.call('ZADD', due_key, c.score, c.id)
      elseif status == 'pending' or status == 'retrying' then
        redis.call('ZREM', due_key, c.id)
      end
      local fields = {'status', c.to, 'updated_at', ARGV[2]}
      if c.set then
        for k, v in pairs(c.set) do
          fields[#fields + 1] = k
          fields[#fields + 1] = v
        end
      end
      redis.call('HSET', rkey, unpack(fields))
      if c.unset and #c.unset > 0 then redis.call('HDEL', rkey, unpack(c.unset)) end
      if c.attempt then
        local akey = prefix .. ':attempts:' .. c.id
        if redis.call('LPUSH', akey, c.attempt) > kept then redis.call('LTRIM', akey, 0, kept - 1) end
      end
      if c.stat then stats[c.stat] = (stats[c.stat] or 0) + 1 end
      if c.event and channel ~= '' then redis.call('PUBLISH', channel, c.event) end
      if c.also and not parking and channel ~= '' then redis.call('PUBLISH', channel, c.also) end
      status = c.to
      if parking then applied = 2 end
    end
  end
  local row = {applied, status or ''}
  if applied > 0 and c.load then
    row[3] = redis.call('HGETALL', prefix .. ':message:' .. c.id)
    row[4] = redis.call('HGETALL', rkey)
  end
  out[i] = row
end
for stat, n in pairs(stats) do
  local skey = prefix .. ':stats:' .. stat .. ':' .. minute
  redis.call('INCRBY', skey, n)
  redis.call('EXPIRE', skey, 7200)
end
return out

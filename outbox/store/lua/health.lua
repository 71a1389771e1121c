-- Record delivery attempt outcomes in each destination's health and run its circuit
-- breaker (see docs/destinations.md), atomically. Runs in the same pipeline as, and
-- before, transition.lua: an outcome that opens the breaker is seen by the transition,
-- which then parks the message instead of charging a retry.
--
-- KEYS[1] outbox:probes (none with more than one partition: every outcome of a call is of
--   one destination, and every key in its home slot; see probe_at and the reply below)
-- ARGV: named (lib/args.lua):
--   prefix: of each destination's keys (its state hash, health per minute, errors per
--     hour: lib/keys.lua), found at run time in the outcomes
--   now: epoch seconds   channel: Pub/Sub channel ("" = none)
--   config: JSON object destination -> [breaker settings], named by config_fields
--     (comma-separated): failures (0 = no breaker), failure_rate, min_attempts,
--     window (seconds), cooldown, max_cooldown, disable_after (0 = never). The entry
--     "endpoint:" (the reserved prefix alone, never a destination's name) is the settings
--     of every endpoint registered at runtime ("endpoint:<id>") without an entry of its
--     own: the config does not grow with the endpoints (docs/webhooks.md)
--   outcomes: JSON list of outcomes, each a list named by outcome_fields
--     (comma-separated): destination, kind ("s" success, "r" retryable failure, "p"
--     permanent failure), ms (duration), code (status code, 0 = none), class (error
--     class), error (text), retry_after (seconds, 0 = none), id (message id),
--     started_at (when the attempt started, epoch seconds; its failure starts a run of
--     failures then, before its message's dead-letter time, so "recover since" finds
--     it; may be absent), lease (the claim's lease token: with more than one partition
--     the grant lease|id ends; may be absent), seq (the outcome's number in its worker
--     run, from 1, in the order decided; may be absent or 0)
--   run: the worker run's token ("" or absent: none), horizon: seconds its counted
--     mark is kept, at least 60. An exchange is written again after a lost
--     reply or a failed later step (its outcomes and their numbers the same, the run's
--     outcomes decided since numbered higher): an outcome numbered at or below its
--     destination's mark for the run was counted and is skipped, so health, failure
--     runs and the breaker count each attempt once (docs/architecture.md). The mark:
--     with more than one partition, one per destination (K.counted: its call is its
--     own, and its outcomes may be held back alone while its home slot moves); with
--     one, one for the run (K.counted_run): a call counts every destination's outcomes
--     at once, and a run writes a call again before any later one
--     (outbox/delivery/loop.py, write_and_claim), so the highest number counted covers
--     every destination (one SET per call, not one per destination).
--   buckets: the latency histogram's bucket count N (LATENCY_BUCKETS,
--     outbox/store/destination_state.py): a minute's field b<i> counts attempts <= 2^i ms
-- With more than one partition, returns {events, probe times (flat: destination, epoch s),
--   destinations holding their messages}; else the events. The events of the state
--   changes made (JSON strings), each also PUBLISHed:
--   {"event": "destination.<failing|recovered|opened|closed|disabled>",
--    "destination": ..., "at": now, ...detail}
--! include args
--! include keys
--! include breaker
local opts = named_args()
local prefix, now_s, channel = K.setup(opts), opts.now, opts.channel
local now = tonumber(now_s)
local CONFIG_FIELDS, OUTCOME_FIELDS = split(opts.config_fields), split(opts.outcome_fields)
local configs = {}
for dest, values in pairs(cjson.decode(opts.config)) do configs[dest] = named_list(values, CONFIG_FIELDS) end
local ENDPOINT_PREFIX = 'endpoint:'
local function config_of(dest)
  local cfg = configs[dest]
  if cfg == nil and string.sub(dest, 1, #ENDPOINT_PREFIX) == ENDPOINT_PREFIX then cfg = configs[ENDPOINT_PREFIX] end
  return cfg
end
local outcomes = cjson.decode(opts.outcomes)
local probes_key = KEYS[1]
local run, horizon = opts.run or '', tonumber(opts.horizon or '0') or 0
local minute = math.floor(now / 60)
local hour = math.floor(now / 3600)
local NB = tonumber(opts.buckets)  -- buckets 0..NB-1: latency <= 2^i ms; bucket NB: above (LATENCY_BUCKETS)
local FAILING_AFTER = 3   -- consecutive failures before destination.failing
local FIELDS = {'admin', 'breaker', 'consecutive', 'failing_since', 'failing_notified', 'cooldown',
                'probe_id', 'blocked_until', 'next_probe_at', 'lat_sum', 't_s', 't_r', 't_p'}
local TOTALS = #FIELDS - 2  -- t_s, t_r, t_p: then lb0 .. lb<NB> (the state hash's totals, read here and
for i = 0, NB do FIELDS[#FIELDS + 1] = 'lb' .. i end  -- written back by the one HSET: no HINCRBY each)
-- The carried minute (see carry below): cm, its number, then its counts cs, cr, cp, cb0 .. cb<NB>
local CARRIED = #FIELDS + 1
FIELDS[CARRIED] = 'cm'
for _, k in ipairs({'s', 'r', 'p'}) do FIELDS[#FIELDS + 1] = 'c' .. k end
for i = 0, NB do FIELDS[#FIELDS + 1] = 'cb' .. i end

local events = {}
-- When the wake check must look at a destination (outbox:probes). With more than one
-- partition that key is one across the deployment, which this script (in the
-- destination's home slot) must not touch: the times are returned for the caller to write.
local probe_times = {}
local function probe_at(at, dest)
  if K.parts <= 1 then
    redis.call('ZADD', probes_key, at, dest)
  else
    probe_times[#probe_times + 1] = dest
    probe_times[#probe_times + 1] = string.format('%.6f', at)
  end
end
local function emit(name, dest, detail)
  local e = detail or {}
  e.event, e.destination, e.at = name, dest, now
  local raw = cjson.encode(e)
  events[#events + 1] = raw
  if channel ~= '' then redis.call('PUBLISH', channel, raw) end
end

local function bucket(ms)
  local i, bound = 0, 1
  while ms > bound and i < NB do
    bound = bound * 2
    i = i + 1
  end
  return i
end

local function human(seconds)
  if seconds >= 86400 and seconds % 86400 == 0 then return string.format('%d days', seconds / 86400) end
  if seconds >= 3600 and seconds % 3600 == 0 then return string.format('%d hours', seconds / 3600) end
  return string.format('%g s', seconds)
end

-- sent: the highest outcome number this run gave an earlier call (0 = none): the mark
-- (the highest one counted) is no higher, so a destination whose outcomes are all numbered
-- above it has none counted yet and its mark need not be read (absent: always read).
local sent = tonumber(opts.sent or '') or math.huge
local fresh = {}  -- destination -> the lowest number of its outcomes in this call
for _, values in ipairs(outcomes) do
  local o = named_list(values, OUTCOME_FIELDS)
  local seq = tonumber(o.seq or '0') or 0
  if fresh[o.destination] == nil or seq < fresh[o.destination] then fresh[o.destination] = seq end
end
local run_mark  -- one partition: the run's mark, read at most once per call
local function counted_mark(dest)
  if K.parts > 1 then return tonumber(redis.call('GET', K.counted(prefix, dest, run)) or '0') end
  if run_mark == nil then run_mark = tonumber(redis.call('GET', K.counted_run(prefix, run)) or '0') end
  return run_mark
end
local states, order = {}, {}
local function state(dest)
  local st = states[dest]
  if st then return st end
  local v = redis.call('HMGET', K.dest(prefix, dest), unpack(FIELDS))
  st = {admin = v[1] or 'active', breaker = v[2] or 'closed', consecutive = tonumber(v[3] or '0'),
        failing_since = v[4] and tonumber(v[4]) or nil, failing_notified = v[5] == '1',
        cooldown = tonumber(v[6] or '0'), probe_id = v[7] or '', blocked_until = tonumber(v[8] or '0'),
        next_probe_at = tonumber(v[9] or '0'), lat_sum = tonumber(v[10] or '0'), totals = {},
        set = {}, del = {}, agg = {s = 0, r = 0, p = 0, sum = 0, b = {}}, errors = {}, failed = false}
  for i = TOTALS, CARRIED - 1 do st.totals[FIELDS[i]] = tonumber(v[i] or '0') end
  st.cm, st.carried = tonumber(v[CARRIED] or ''), {}
  for i = CARRIED + 1, #FIELDS do st.carried[FIELDS[i]] = tonumber(v[i] or '0') end
  st.counted = 0
  -- the run's mark is read only when one of this destination's outcomes may be at or below
  -- it: one numbered at or below "sent" (the highest number of an earlier call of the run)
  if run ~= '' and (fresh[dest] or 0) <= sent then
    st.counted = counted_mark(dest)
  end
  st.top = st.counted
  states[dest] = st
  order[#order + 1] = dest
  return st
end
local function put(st, field, value)
  st.set[field] = tostring(value)
  st.del[field] = nil
end
local function drop(st, field)
  st.set[field] = nil
  st.del[field] = true
end

local function open(dest, st, cfg, reason, detail)
  st.breaker = 'open'
  st.cooldown = cfg.cooldown
  st.next_probe_at = now + cfg.cooldown
  put(st, 'breaker', 'open')
  put(st, 'opened_at', now_s)
  put(st, 'cooldown', st.cooldown)
  put(st, 'next_probe_at', st.next_probe_at)
  drop(st, 'probe_id')
  drop(st, 'probe_deadline')
  probe_at(st.next_probe_at, dest)
  detail.reason, detail.next_probe_at = reason, st.next_probe_at
  emit('destination.opened', dest, detail)
end

-- The breaker closes: what it parked goes back (the wake check unparks; the worker does
-- at once too). reason: why, when it is not a successful attempt (the event says it).
local function close(dest, st, reason)
  st.breaker = 'closed'
  put(st, 'breaker', 'closed')
  for _, f in ipairs(BREAKER_OPEN_FIELDS) do drop(st, f) end
  probe_at(now, dest)
  emit('destination.closed', dest, reason and {reason = reason} or {})
end

local function disable(dest, st, reason)
  st.admin = 'disabled'
  put(st, 'admin', 'disabled')
  put(st, 'admin_reason', reason)
  put(st, 'admin_at', now_s)
  emit('destination.disabled', dest, {reason = reason})
end

-- One attempt's outcome counted in its destination's health and breaker.
local function count(o, st)
  local dest, kind, ms, code, cls, err = o.destination, o.kind, tonumber(o.ms), tonumber(o.code), o.class, o.error
  local ra, id = tonumber(o.retry_after), o.id
  local cfg = config_of(dest)
  if cfg and cfg.failures == 0 and st.breaker ~= 'closed' then
    -- no breaker is configured now: a state an earlier setting left open or half open
    -- would park this destination's messages for good
    close(dest, st, 'no breaker configured')
  end
  local agg = st.agg
  agg[kind] = agg[kind] + 1
  agg.sum = agg.sum + ms
  local b = bucket(ms)
  agg.b[b] = (agg.b[b] or 0) + 1
  if kind == 's' then
    st.consecutive = 0
    put(st, 'consecutive', 0)
    put(st, 'last_success_at', now_s)
    if st.failing_notified then
      emit('destination.recovered', dest, {failing_since = st.failing_since})
      st.failing_notified = false
      drop(st, 'failing_notified')
    end
    if st.failing_since then
      put(st, 'last_failing_since', st.failing_since)  -- "recover since" after recovery
      st.failing_since = nil
      drop(st, 'failing_since')
    end
    if st.breaker ~= 'closed' then close(dest, st) end
  else
    st.failed = true
    st.consecutive = st.consecutive + 1
    put(st, 'consecutive', st.consecutive)
    put(st, 'last_failure_at', now_s)
    if not st.failing_since then
      local started = tonumber(o.started_at) or now
      if started > now then started = now end
      st.failing_since = started
      put(st, 'failing_since', string.format('%.6f', started))
    end
    local gkey = tostring(code) .. '|' .. cls
    local g = st.errors[gkey] or {n = 0}
    g.n, g.err = g.n + 1, err
    st.errors[gkey] = g
    if ra > 0 and (code == 429 or code == 503) and now + ra > st.blocked_until then
      st.blocked_until = now + ra
      put(st, 'blocked_until', st.blocked_until)
    end
    local threshold = FAILING_AFTER
    if cfg and cfg.failures > 0 and cfg.failures < threshold then threshold = cfg.failures end
    if not st.failing_notified and st.consecutive >= threshold then
      st.failing_notified = true
      put(st, 'failing_notified', '1')
      emit('destination.failing', dest, {failing_since = st.failing_since, consecutive_failures = st.consecutive,
                                         status_code = code, error_class = cls, error = err})
    end
    if code == 410 and st.admin ~= 'disabled' then disable(dest, st, '410 Gone') end
    if cfg and cfg.failures > 0 then
      if st.breaker == 'closed' and st.consecutive >= cfg.failures then
        open(dest, st, cfg, 'consecutive failures', {consecutive_failures = st.consecutive})
      elseif st.breaker == 'half_open' and id == st.probe_id then
        -- The probe failed: open again, with twice the cool-down (capped).
        st.breaker = 'open'
        st.cooldown = math.min(math.max(st.cooldown, cfg.cooldown) * 2, cfg.max_cooldown)
        st.next_probe_at = now + st.cooldown
        put(st, 'breaker', 'open')
        put(st, 'cooldown', st.cooldown)
        put(st, 'next_probe_at', st.next_probe_at)
        drop(st, 'probe_id')
        drop(st, 'probe_deadline')
        probe_at(st.next_probe_at, dest)
      end
    end
    if cfg and cfg.disable_after > 0 and st.admin == 'active' and now - st.failing_since >= cfg.disable_after then
      disable(dest, st, 'failing for ' .. human(cfg.disable_after))
    end
  end
end

-- The grants the outcomes end, per destination, removed in one ZREM after the loop: one
-- per outcome, a grant already gone (lapsed and dropped, or given back) after the one
-- that emptied the set was a ZREM of a key that no longer exists, on a slot held
-- half-moved by a legacy migration a non-local key: the script aborted after its writes.
local ended, ended_order = {}, {}
for _, values in ipairs(outcomes) do
  local o = named_list(values, OUTCOME_FIELDS)
  local dest, id = o.destination, o.id
  local st = state(dest)
  if K.parts > 1 and id and id ~= '' and o.lease and o.lease ~= '' then
    -- its gate's grant ends (gate.lua: K.inflight_member, so that another claim's
    -- grant of the same message, given back, cannot end this one)
    if not ended[dest] then
      ended[dest] = {}
      ended_order[#ended_order + 1] = dest
    end
    table.insert(ended[dest], K.inflight_member(o.lease, id))
  end
  local seq = tonumber(o.seq or '0') or 0
  if run ~= '' and seq > 0 and seq <= st.counted then
    -- counted by an earlier call of this run's exchange (its reply lost, or a later
    -- step failed): not again; the wake check still learns an open breaker's probe time
    if st.breaker == 'open' and not st.reprobed then
      st.reprobed = true
      probe_at(st.next_probe_at, dest)
    end
  else
    if seq > st.top then st.top = seq end
    count(o, st)
  end
end
for _, dest in ipairs(ended_order) do
  redis.call('ZREM', K.inflight(prefix, dest), unpack(ended[dest]))
end

-- This minute's counts, with more than one partition: in the minute's hash at once. It is
-- given its time to live when it is new: then every field written is new, so each
-- HINCRBY answers its own increment (kept 2 h after the minute's end).
local function to_minute_hash(dest, agg)
  local hkey = K.health(prefix, dest, minute)
  local new = false
  for _, k in ipairs({'s', 'r', 'p'}) do
    if agg[k] > 0 and redis.call('HINCRBY', hkey, k, agg[k]) == agg[k] then new = true end
  end
  for i, n in pairs(agg.b) do redis.call('HINCRBY', hkey, 'b' .. i, n) end
  if new then redis.call('EXPIRE', hkey, 7260) end
end

-- A carried minute that has passed goes to its minute's hash (HINCRBY: added to what a
-- worker of an earlier version may have written there), kept 2 h after the minute's end
-- (nothing written when that is past); its fields are emptied.
local function flush_carried(dest, st)
  if not st.cm then return end
  local keep, hkey = (st.cm + 1) * 60 + 7200, K.health(prefix, dest, st.cm)
  local wrote = false
  for f, n in pairs(st.carried) do  -- f: cs, cr, cp, cb<i>; the minute hash's field without the c
    if n > 0 then
      if keep > now then
        redis.call('HINCRBY', hkey, string.sub(f, 2), n)
        wrote = true
      end
      st.carried[f] = 0
      drop(st, f)
    end
  end
  if wrote then redis.call('EXPIREAT', hkey, math.ceil(keep)) end
end

-- This minute's counts, on one partition: carried in the state hash (cm, cs, cr, cp, cb<i>),
-- read by its HMGET and written by its HSET, so an exchange adds no command of its own
-- for them (a minute's hash of its own was 2 HINCRBY and an EXPIRE per destination and
-- exchange); the carried minute goes to its minute's hash when a later minute's outcomes
-- come. Readers add the carried minute to the minute hashes
-- (outbox/store/reads/destination_reads.py). With more than one partition the carried
-- minute's hash, known only here, could not be declared in KEYS: to_minute_hash.
local function carry(dest, st, agg)
  if st.cm ~= minute then
    flush_carried(dest, st)
    st.cm = minute
    put(st, 'cm', minute)
  end
  local c = st.carried
  for _, k in ipairs({'s', 'r', 'p'}) do
    if agg[k] > 0 then
      c['c' .. k] = c['c' .. k] + agg[k]
      put(st, 'c' .. k, c['c' .. k])
    end
  end
  for i, n in pairs(agg.b) do
    c['cb' .. i] = c['cb' .. i] + n
    put(st, 'cb' .. i, c['cb' .. i])
  end
end

local run_top = 0  -- one partition: the highest outcome number this call counted
for _, dest in ipairs(order) do
  local st = states[dest]
  local agg = st.agg
  local dkey = K.dest(prefix, dest)
  -- This minute's counts (carry, to_minute_hash); the state hash's totals go in its HSET below.
  for _, k in ipairs({'s', 'r', 'p'}) do
    if agg[k] > 0 then put(st, 't_' .. k, st.totals['t_' .. k] + agg[k]) end
  end
  for i, n in pairs(agg.b) do put(st, 'lb' .. i, st.totals['lb' .. i] + n) end
  if agg.s + agg.r + agg.p > 0 then
    put(st, 'lat_sum', string.format('%.17g', st.lat_sum + agg.sum / 1000))
    if K.parts <= 1 then carry(dest, st, agg) else to_minute_hash(dest, agg) end
  end
  if next(st.errors) then
    local ekey = K.errors(prefix, dest, hour)
    for g, v in pairs(st.errors) do
      redis.call('HINCRBY', ekey, 'c:' .. g, v.n)
      redis.call('HSET', ekey, 't:' .. g, now_s, 'e:' .. g, v.err)
    end
    redis.call('EXPIRE', ekey, 90000)
  end
  -- The failure rate over the window (whole minutes, this call's attempts included).
  local cfg = config_of(dest)
  if cfg and cfg.failures > 0 and st.failed and st.breaker == 'closed' then
    local n, failed = 0, 0
    for m = minute - math.ceil(cfg.window / 60) + 1, minute do
      local v = redis.call('HMGET', K.health(prefix, dest, m), 's', 'r', 'p')
      local s, r, p = tonumber(v[1] or '0'), tonumber(v[2] or '0'), tonumber(v[3] or '0')
      n, failed = n + s + r + p, failed + r + p
    end
    if st.cm == minute then  -- this minute's carried counts (carry)
      local c = st.carried
      n, failed = n + c.cs + c.cr + c.cp, failed + c.cr + c.cp
    end
    if n >= cfg.min_attempts and failed / n > cfg.failure_rate then
      open(dest, st, cfg, 'failure rate', {consecutive_failures = st.consecutive, failure_rate = failed / n, attempts = n})
    end
  end
  if st.top > st.counted then
    if K.parts > 1 then
      redis.call('SET', K.counted(prefix, dest, run), st.top, 'EX', math.max(60, math.ceil(horizon)))
    elseif st.top > run_top then
      run_top = st.top
    end
  end
  local fields = {}
  for f, v in pairs(st.set) do
    fields[#fields + 1] = f
    fields[#fields + 1] = v
  end
  if #fields > 0 then redis.call('HSET', dkey, unpack(fields)) end
  local gone = {}
  for f in pairs(st.del) do gone[#gone + 1] = f end
  if #gone > 0 then redis.call('HDEL', dkey, unpack(gone)) end
end
if run_top > 0 then  -- one partition: the run's one mark (the highest number counted)
  redis.call('SET', K.counted_run(prefix, run), run_top, 'EX', math.max(60, math.ceil(horizon)))
end
if K.parts <= 1 then return events end
-- With more than one partition: also the probe times to write (above) and the
-- destinations that hold their messages now (paused, disabled, breaker not closed),
-- which the transitions of the outcomes (transition.lua, in the partitions) are given.
local holding = {}
for _, dest in ipairs(order) do
  local st = states[dest]
  if st.admin == 'paused' or st.admin == 'disabled' or st.breaker == 'open' or st.breaker == 'half_open' then
    holding[#holding + 1] = dest
  end
end
return {events, probe_times, holding}

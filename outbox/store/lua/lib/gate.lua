--! needs keys
-- A destination's gate (docs/destinations.md): whether, and when, a claim may take a due
-- message of it, from its state read once per call and counted in memory while the call
-- runs. Used by claim.lua (one partition, every key in reach) and, with more than one
-- partition, by gate.lua in the destination's home slot (the claim of the partition then
-- applies its answers: claim_apply.lua). What each answer means, and the sources of the
-- rules (TCP slow start after a Retry-After, GCRA), is in claim.lua's header.
--
-- gate_setup(prefix, now_s, deadline, limits, caps, count_sending): the call's inputs
--   (a destination not in limits may carry its own in its state hash's 'limits' field:
--   an endpoint registered at runtime; one not in caps has the cap of caps['*'], each
--   its own count, or none when caps has no '*');
--   count_sending(dest) -> attempts of dest in flight (read once, for MAX_CONCURRENCY).
-- gate_decide(dest, score) -> action[, at]: 'park', 'probe', 'take', 'later' (at: the
--   time it is due again; the message keeps its retry count), 'hold' (within the due
--   slack of its release slot, or not yet due at a destination with a MAX_CONCURRENCY:
--   left as it is, not before its time) or 'cap' (the
--   destination is at its cap in this call: left due). A 'take' or 'probe' is counted
--   (caps, in-flight count, GCRA TAT).
-- gate_probe(dest, id): the probe was claimed: breaker half_open, probe_id, probe_deadline.
-- gate_flush(): writes the release counters and GCRA TATs this call moved, once each.
-- gate_states(): flat, per endpoint (a destination named "endpoint:...") this call gated,
--   in the order met: its name and, as its state hash holds them, 'admin', 'admin_reason'
--   and 'limits' ("" for a field absent). The worker compares them with the endpoint's row
--   (outbox/destinations/config.py, EndpointCache) and repairs a change whose on-commit
--   step was lost, without a read of its own: the gate's HMGET reads them anyway.
-- Needs lib/keys.lua included before it.
local GATE = {}
local gates = {}
local gated = {}         -- destinations this call gated, in the order met
local tat_changed = {}   -- destinations whose TAT this call moved, in first-changed order
local ramp_changed = {}  -- destinations whose release counter (ramp_k) this call moved
local CONCURRENCY_DELAY = 0.2  -- seconds a message over MAX_CONCURRENCY waits before it is looked at again
local RAMP_STEP, RAMP_FIRST, RAMP_WINDOW = 1.0, 4, 30  -- release after a Retry-After: seconds, messages, seconds
local LOG2 = math.log(2)
-- The caps entry for every destination the caps do not name (outbox/store/exchange.py
-- OTHERS): each such destination may take that many, counted per destination, so the
-- caps name only the destinations the worker has attempts of in flight, however many
-- endpoints exist.
local OTHERS = '*'

local function gate_setup(prefix, now_s, deadline, limits, caps, count_sending)
  GATE.prefix, GATE.now_s, GATE.now, GATE.deadline = prefix, now_s, tonumber(now_s), deadline
  GATE.limits, GATE.caps, GATE.count_sending = limits, caps, count_sending
end

local function gate(dest)
  local g = gates[dest]
  if g then return g end
  local now = GATE.now
  local v = redis.call('HMGET', K.dest(GATE.prefix, dest), 'admin', 'breaker', 'next_probe_at',
                       'probe_deadline', 'blocked_until', 'ramp_of', 'ramp_k', 'ramp_tat', 'limits',
                       'admin_reason')
  g = {admin = v[1] or 'active', breaker = v[2] or 'closed', next_probe = tonumber(v[3] or '0'),
       probe_deadline = tonumber(v[4] or '0'), blocked = tonumber(v[5] or '0'), lim = GATE.limits[dest], spaced = 0,
       stored = {v[1] or '', v[10] or '', v[9] or ''}}
  gated[#gated + 1] = dest
  if g.lim == nil and v[9] then
    -- an endpoint registered at runtime keeps its limits in its state hash (written when
    -- it changes: outbox/store/endpoint_versions.py), so the call's limits JSON does not
    -- grow with the endpoints: "[T, tau, max concurrency]" as in that JSON
    g.lim = cjson.decode(v[9])
  end
  if g.blocked > 0 and now < g.blocked + RAMP_WINDOW then
    -- the release after a Retry-After; a new block starts its count again
    g.ramp_of = v[5]
    g.ramp_k = (v[6] == v[5]) and tonumber(v[7] or '0') or 0
    g.ramp_tat = (v[6] == v[5]) and tonumber(v[8] or '0') or 0
    g.ramp_first = RAMP_FIRST
    if g.lim and g.lim[1] > 0 then g.ramp_first = math.max(RAMP_FIRST, RAMP_STEP / g.lim[1]) end
  end
  if g.lim and g.lim[3] > 0 then g.sending = GATE.count_sending(dest) end
  if g.lim and g.lim[1] > 0 then
    g.tat = tonumber(redis.call('GET', K.gcra(GATE.prefix, dest)) or '0')
  end
  gates[dest] = g
  return g
end

local function ramp_moved(g, dest)
  if not g.ramp_moved then
    g.ramp_moved = true
    ramp_changed[#ramp_changed + 1] = dest
  end
end

-- The next release slot after a Retry-After; counts it.
local function ramp_slot(g, dest)
  local at = g.blocked + RAMP_STEP * math.log(1 + g.ramp_k / g.ramp_first) / LOG2
  g.ramp_k, g.last_slot = g.ramp_k + 1, at
  ramp_moved(g, dest)
  return at
end

-- The release's pace at `now`: seconds between two attempts at the rate the slots follow
-- (k slots by t seconds after the block: first * (2^(t / RAMP_STEP) - 1); its derivative).
local function ramp_interval(g, now)
  local t = math.max(0, now - g.blocked)
  return RAMP_STEP / (g.ramp_first * LOG2 * 2 ^ (t / RAMP_STEP))
end

local function gate_decide(dest, score)
  local g = gate(dest)
  local now = GATE.now
  score = tonumber(score)
  if g.admin ~= 'active' then return 'park' end
  if g.breaker ~= 'closed' then
    if (g.breaker == 'open' and now >= g.next_probe) or (g.breaker == 'half_open' and now > g.probe_deadline) then
      if g.sending then g.sending = g.sending + 1 end
      g.breaker, g.probe_deadline = 'half_open', tonumber(GATE.deadline)
      return 'probe'
    end
    return 'park'
  end
  if g.ramp_of and score < g.blocked and ramp_slot(g, dest) > now then
    return 'later', g.last_slot  -- held by the block: to its release slot (the slot just counted)
  end
  if g.ramp_of and score > now then return 'hold' end  -- its release slot is within the due slack
  local interval
  if g.ramp_of then
    -- Paced as a GCRA at the release's rate, with a burst of RAMP_FIRST: a claim that
    -- comes late (no run for a while) does not take every slot that passed at once.
    interval = ramp_interval(g, now)
    local tau = (RAMP_FIRST - 1) * interval
    if now < g.ramp_tat - tau then
      local at = math.max(g.ramp_tat - tau, g.ramp_next or 0)
      g.ramp_next = at + interval
      return 'later', at
    end
  end
  local cap = GATE.caps[dest]
  if cap == nil then cap = GATE.caps[OTHERS] end  -- an unlisted destination: the default share
  if cap ~= nil and cap <= 0 then return 'cap' end
  local lim = g.lim
  -- A message taken early (within the claim's due slack) waits for its due time in the
  -- worker; under a MAX_CONCURRENCY that wait would hold one of the destination's slots
  -- from messages already due: such a destination is claimed only once due.
  if lim and lim[3] > 0 and score > now then return 'hold' end
  if lim and lim[3] > 0 and g.sending >= lim[3] then
    g.spaced = g.spaced + 1
    return 'later', now + CONCURRENCY_DELAY + g.spaced * 1e-3
  end
  if lim and lim[1] > 0 and now < math.max(g.tat, now) - lim[2] then
    -- GCRA refuses: the next slot is TAT - tau; later ones follow at T apart.
    local at = math.max(g.tat - lim[2], g.next_slot or 0)
    g.next_slot = at + lim[1]
    return 'later', at
  end
  if lim and lim[1] > 0 then
    if not g.tat_changed then
      g.tat_changed = true
      tat_changed[#tat_changed + 1] = dest
    end
    g.tat = math.max(g.tat, now) + lim[1]
  end
  if cap ~= nil then GATE.caps[dest] = cap - 1 end
  if g.sending then g.sending = g.sending + 1 end
  if interval then
    g.ramp_tat = math.max(g.ramp_tat, now) + interval
    ramp_moved(g, dest)
  end
  return 'take'
end

local function gate_probe(dest, id)
  redis.call('HSET', K.dest(GATE.prefix, dest), 'breaker', 'half_open', 'probe_id', id, 'probe_deadline', GATE.deadline)
end

local function gate_flush()
  for _, dest in ipairs(ramp_changed) do
    local g = gates[dest]
    redis.call('HSET', K.dest(GATE.prefix, dest), 'ramp_of', g.ramp_of, 'ramp_k', g.ramp_k,
               'ramp_tat', string.format('%.6f', g.ramp_tat))
  end
  for _, dest in ipairs(tat_changed) do
    local tat = gates[dest].tat
    redis.call('SET', K.gcra(GATE.prefix, dest), string.format('%.6f', tat), 'PX', math.ceil((tat - GATE.now) * 1000) + 1000)
  end
end

local ENDPOINT_PREFIX = 'endpoint:'  -- outbox/endpoint_names.py ENDPOINT_PREFIX

local function gate_states()
  local out = {}
  for _, dest in ipairs(gated) do
    if string.sub(dest, 1, #ENDPOINT_PREFIX) == ENDPOINT_PREFIX then
      local stored = gates[dest].stored
      out[#out + 1] = dest
      out[#out + 1] = stored[1]
      out[#out + 1] = stored[2]
      out[#out + 1] = stored[3]
    end
  end
  return out
end

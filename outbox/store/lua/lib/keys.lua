-- Key names a script finds only at run time (ids it reads from an index, the destination
-- or queue a resend record names), built from the prefix it is given: the one place in
-- Lua that spells a key name. Every key a script can know before it runs is built by
-- outbox/store/keys.py and passed in KEYS instead. Each function returns what the
-- Keys method of the same name returns for the same inputs (tests/store/test_lua_keys.py
-- runs these in Redis and compares).
local K = {}
-- Partitions (outbox/store/keys.py, Keys): with more than one (K.parts, which a script
-- sets from its `parts` argument before building a name), a message's keys and its
-- partition's indexes carry the tag {p<k>} (k from the id's "_p<k>" end), a destination's
-- state its home tag {d:<destination>}, the keys across the deployment {g}. With one,
-- no name carries a tag.
K.parts = 1
-- Characters (code points) of UTF-8 text, as Python's len() counts them: bytes that are
-- not continuation bytes (0x80-0xBF).
local function utf8_length(text) return select(2, string.gsub(text, '[^\128-\191]', '')) end
-- The prefix of the partition message `id` lives in (Keys.tag_prefix): index keys of
-- that partition take it as their prefix.
function K.part(prefix, id)
  if K.parts <= 1 then return prefix end
  local k = string.match(id, '_p(%d+)$') or '0'
  return prefix .. ':{p' .. k .. '}'
end
-- The prefix of partition number k (Keys.tag_prefix).
function K.partition(prefix, k)
  if K.parts <= 1 then return prefix end
  return prefix .. ':{p' .. k .. '}'
end
-- Read a script's named `parts` argument (1 when absent) and return its `prefix`.
function K.setup(opts)
  K.parts = tonumber(opts.parts or '1')
  return opts.prefix
end
function K.home(prefix, dest)
  if K.parts <= 1 then return prefix end
  return prefix .. ':{d:' .. dest .. '}'
end
function K.shared(prefix)
  if K.parts <= 1 then return prefix end
  return prefix .. ':{g}'
end
-- a message's records: prefix is the deployment's
function K.message(prefix, id) return K.part(prefix, id) .. ':message:' .. id end
function K.resend(prefix, id) return K.part(prefix, id) .. ':resend:' .. id end
function K.attempts(prefix, id) return K.part(prefix, id) .. ':attempts:' .. id end
-- a partition's indexes: pp is the partition's prefix (K.part)
function K.status(pp, status, dest) return pp .. ':status:' .. status .. ':dest:' .. dest end
function K.created(pp, dest) return pp .. ':created:dest:' .. dest end
function K.due(pp, queue) return pp .. ':due:' .. queue end
function K.quarantine(pp, queue) return pp .. ':quarantine:' .. queue end
function K.parked(pp, dest) return pp .. ':parked:' .. dest end
function K.stats(pp, outcome, minute) return pp .. ':stats:' .. outcome .. ':' .. minute end
function K.idempotency(pp, dest, key) return pp .. ':idempotency:' .. utf8_length(dest) .. ':' .. dest .. ':' .. key end
function K.order(pp, dest, key) return pp .. ':order:' .. utf8_length(dest) .. ':' .. dest .. ':' .. key end
function K.order_state(pp, dest, key) return pp .. ':orderstate:' .. utf8_length(dest) .. ':' .. dest .. ':' .. key end
function K.order_log(pp, dest, key) return pp .. ':orderlog:' .. utf8_length(dest) .. ':' .. dest .. ':' .. key end
function K.payload(pp, event_id) return pp .. ':payload:' .. event_id end
function K.blocked(pp, dest) return pp .. ':blocked:' .. dest end
-- a destination's state: prefix is the deployment's
function K.dest(prefix, dest) return K.home(prefix, dest) .. ':dest:' .. dest end
function K.health(prefix, dest, minute) return K.home(prefix, dest) .. ':health:' .. dest .. ':' .. minute end
function K.errors(prefix, dest, hour) return K.home(prefix, dest) .. ':errors:' .. dest .. ':' .. hour end
function K.gcra(prefix, dest) return K.home(prefix, dest) .. ':gcra:' .. dest end
function K.inflight(prefix, dest) return K.home(prefix, dest) .. ':inflight:' .. dest end
-- a member of K.inflight (Keys.inflight_member): not a key, but a name both sides build
function K.inflight_member(lease, id) return lease .. '|' .. id end
function K.counted(prefix, dest, run) return K.home(prefix, dest) .. ':counted:' .. dest .. ':' .. run end
function K.counted_run(prefix, run) return K.shared(prefix) .. ':counted:' .. run end
-- across the deployment: prefix is the deployment's
function K.wake(prefix, queue) return K.shared(prefix) .. ':wake:' .. queue end

-- Key names a script finds only at run time (ids it reads from an index, the destination
-- or queue a resend record names), built from the prefix it is given: the one place in
-- Lua that spells a key name. Every key a script can know before it runs is built by
-- outbox/store/keys.py and passed in KEYS instead. Each function returns what the
-- Keys method of the same name returns for the same inputs (tests/store/test_lua_keys.py
-- runs these in Redis and compares).
local K = {}
-- Characters (code points) of UTF-8 text, as Python's len() counts them: bytes that are
-- not continuation bytes (0x80-0xBF).
local function utf8_length(text) return select(2, string.gsub(text, '[^\128-\191]', '')) end
function K.message(prefix, id) return prefix .. ':message:' .. id end
function K.resend(prefix, id) return prefix .. ':resend:' .. id end
function K.attempts(prefix, id) return prefix .. ':attempts:' .. id end
function K.status(prefix, status, dest) return prefix .. ':status:' .. status .. ':dest:' .. dest end
function K.created(prefix, dest) return prefix .. ':created:dest:' .. dest end
function K.due(prefix, queue) return prefix .. ':due:' .. queue end
function K.quarantine(prefix, queue) return prefix .. ':quarantine:' .. queue end
function K.wake(prefix, queue) return prefix .. ':wake:' .. queue end
function K.idempotency(prefix, dest, key) return prefix .. ':idempotency:' .. utf8_length(dest) .. ':' .. dest .. ':' .. key end
function K.stats(prefix, outcome, minute) return prefix .. ':stats:' .. outcome .. ':' .. minute end
function K.dest(prefix, dest) return prefix .. ':dest:' .. dest end
function K.health(prefix, dest, minute) return prefix .. ':health:' .. dest .. ':' .. minute end
function K.errors(prefix, dest, hour) return prefix .. ':errors:' .. dest .. ':' .. hour end
function K.parked(prefix, dest) return prefix .. ':parked:' .. dest end
function K.gcra(prefix, dest) return prefix .. ':gcra:' .. dest end

-- The fields of a destination's state hash (lib/keys.lua K.dest) that hold an open or
-- half-open circuit breaker: deleted, with 'breaker' set to 'closed', when it closes
-- (health.lua on a success or with no breaker configured, admin.lua's enable and close).
local BREAKER_OPEN_FIELDS = {'opened_at', 'next_probe_at', 'cooldown', 'probe_id', 'probe_deadline'}

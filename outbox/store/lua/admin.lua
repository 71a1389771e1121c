-- An operator's action on a destination: pause, resume, disable or enable; or "close",
-- the breaker state left open or half open by an earlier setting closed when no breaker
-- is configured now (the recovery sweep's). Resume, enable and close do not move parked
-- messages themselves: the caller runs unpark.lua (in batches) after this call.
--
-- KEYS[1] the destination's state hash (outbox:dest:<d>)
-- ARGV: named (lib/args.lua): now (epoch seconds), channel (Pub/Sub, "" = none),
--   destination, action ("pause", "resume", "disable", "enable", "close"), reason ("" = none)
-- Returns the event JSON when the state changed (also PUBLISHed), else false.
--! include args
--! include breaker
local opts = named_args()
local now_s, channel, dest, action, reason = opts.now, opts.channel, opts.destination, opts.action, opts.reason
local dkey = KEYS[1]
local admin = redis.call('HGET', dkey, 'admin') or 'active'
local function close_breaker(...)  -- the fields given are deleted with the breaker's
  local fields = {unpack(BREAKER_OPEN_FIELDS)}
  for _, f in ipairs({...}) do fields[#fields + 1] = f end
  redis.call('HSET', dkey, 'breaker', 'closed')
  redis.call('HDEL', dkey, unpack(fields))
end
if action == 'close' then
  local breaker = redis.call('HGET', dkey, 'breaker') or 'closed'
  if breaker == 'closed' then return false end
  close_breaker()
  local raw = cjson.encode({event = 'destination.closed', destination = dest, at = tonumber(now_s), reason = reason,
                            previous = breaker})
  if channel ~= '' then redis.call('PUBLISH', channel, raw) end
  return raw
end
local to, name
if action == 'pause' then
  if admin ~= 'active' then return false end
  to, name = 'paused', 'destination.paused'
elseif action == 'disable' then
  if admin == 'disabled' then return false end
  to, name = 'disabled', 'destination.disabled'
elseif action == 'resume' then
  if admin ~= 'paused' then return false end
  to, name = 'active', 'destination.resumed'
elseif action == 'enable' then
  if admin ~= 'disabled' then return false end
  to, name = 'active', 'destination.enabled'
  -- Enabling starts afresh: the failure run that disabled it (and its breaker) is over,
  -- so DISABLE_AFTER does not strike again at the next failure.
  close_breaker('failing_since', 'failing_notified')
  redis.call('HSET', dkey, 'consecutive', '0')
else
  return redis.error_reply('unknown action ' .. action)
end
redis.call('HSET', dkey, 'admin', to, 'admin_at', now_s, 'admin_reason', reason)
if to == 'active' then redis.call('HDEL', dkey, 'admin_reason') end
local raw = cjson.encode({event = name, destination = dest, at = tonumber(now_s), reason = reason, previous = admin})
if channel ~= '' then redis.call('PUBLISH', channel, raw) end
return raw

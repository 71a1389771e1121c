-- Create messages: message record, resend record, status and creation indexes,
-- idempotency key. Atomic per call.
--
-- ARGV[1] prefix
-- ARGV[2] idempotency TTL in seconds (0 = keep for ever)
-- ARGV[3] number of messages N, then per message:
--   id, idempotency_key ("" = none), destination, status, status score, created_at,
--   n_message_fields, message field/value pairs..., n_resend_fields, resend pairs...
-- Returns, per message, the id that stands: the new id, or the id already sent
-- under the same idempotency key (then nothing is written for that message).
local prefix = ARGV[1]
local idem_ttl = tonumber(ARGV[2])
local n = tonumber(ARGV[3])
local pos = 4
local out = {}
for i = 1, n do
  local id, idem, dest, status, score, created =
    ARGV[pos], ARGV[pos + 1], ARGV[pos + 2], ARGV[pos + 3], ARGV[pos + 4], ARGV[pos + 5]
  pos = pos + 6
  local nm = tonumber(ARGV[pos]); pos = pos + 1
  local mfields = {}
  for j = 1, nm * 2 do mfields[j] = ARGV[pos + j - 1] end
  pos = pos + nm * 2
  local nr = tonumber(ARGV[pos]); pos = pos + 1
  local rfields = {}
  for j = 1, nr * 2 do rfields[j] = ARGV[pos + j - 1] end
  pos = pos + nr * 2

  local existing = false
  if idem ~= '' then
    local ikey = prefix .. ':idempotency:' .. idem
    existing = redis.call('GET', ikey)
    if not existing then
      if idem_ttl > 0 then
        redis.call('SET', ikey, id, 'EX', idem_ttl)
      else
        redis.call('SET', ikey, id)
      end
    end
  end
  if existing then
    out[i] = existing
  else
    redis.call('HSET', prefix .. ':message:' .. id, unpack(mfields))
    redis.call('HSET', prefix .. ':resend:' .. id, unpack(rfields))
    redis.call('ZADD', prefix .. ':status:' .. status, score, id)
    redis.call('ZADD', prefix .. ':status:' .. status .. ':dest:' .. dest, score, id)
    redis.call('ZADD', prefix .. ':created', created, id)
    redis.call('ZADD', prefix .. ':created:dest:' .. dest, created, id)
    redis.call('SADD', prefix .. ':destinations', dest)
    out[i] = id
  end
end
return out

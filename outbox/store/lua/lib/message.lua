-- The message record under `key`, as scripts return it: {id, record}, where record is
-- the string of outbox.records.Message.message_value, or, for a record written by an
-- older version, the hash's flat HGETALL (GET on a hash is a WRONGTYPE error, caught by
-- pcall).
local function message_record(key, id)
  local raw = redis.pcall('GET', key)
  if type(raw) == 'table' and raw.err then raw = redis.call('HGETALL', key) end
  return {id, raw}
end

-- Upgrade from records written before the due index existed (version 0.1): put a range
-- of a status index's ids (pending or retrying) into their queue's due index, scored by
-- next_attempt_at, unless they are there already. It reads outbox:status:<status>, the
-- index across destinations that older versions kept (0.1 records have it).
--
-- KEYS[1] that index (outbox:status:<status>)
-- ARGV[1] prefix (of the keys found at run time: lib/keys.lua)  ARGV[2] first rank
-- ARGV[3] how many
-- Returns {ids read (fewer than asked: the index is done), ids added to a due index}.
--! include keys
local prefix = ARGV[1]
local first, count = tonumber(ARGV[2]), tonumber(ARGV[3])
local ids = redis.call('ZRANGE', KEYS[1], first, first + count - 1, 'WITHSCORES')
local added = 0
for i = 1, #ids, 2 do
  local id, score = ids[i], ids[i + 1]
  local cur = redis.call('HMGET', K.resend(prefix, id), 'queue', 'next_attempt_at')
  if cur[1] then
    added = added + redis.call('ZADD', K.due(K.part(prefix, id), cur[1]), 'NX', cur[2] or score, id)
  end
end
return {#ids / 2, added}

-- Create one plain message: send()'s common case, written exactly as lua/create.lua
-- writes it (tests/store/test_create_one.py compares every key the two write), without
-- what only other calls need: no idempotency key, no ordering key, no payload record, one
-- message (so no groups, no first pass, no libraries). Its arguments are a third fewer
-- and its Lua a few lines: about a third of create.lua's server time for one message
-- (docs/benchmarks.md, "The send path"). outbox.store.messages.MessageStore.create_call
-- picks it; every other call goes to create.lua.
-- Atomic. Idempotent on the message id: when the message record exists (the call ran
-- before and only its reply was lost, so redis-py's Retry sent it again; or a captured
-- message pushed by both the on-commit fast path and the relay) nothing is written and
-- the reply says "exists", as create.lua's.
--
-- KEYS: 1 message record, 2 resend record, 3 its status index, 4 its queue's due index,
-- 5 its destination's created index; on one server also 6 its queue's wake-up flag and
-- 7 outbox:destinations (the destination's name is added with every call, as create.lua
-- does); with more than one partition none of those two (the caller sets the flag of the
-- queue returned and registers the name: outbox/store/creating.py).
-- ARGV, by position (named on the Python side: outbox.store.messages.CREATE_ONE):
--   1 status, 2 destination, 3 queue, 4 id, 5 score (status score; also the resend
--   record's next_attempt_at), 6 created (created_at; also its updated_at unless a pair
--   below says otherwise), 7 record (the message record: outbox.records codec's
--   message_value), 8 wake ("" when the message is not due by now + slack, else the wake
--   flag's value: now, epoch seconds), 9 wake_ttl_ms ("" with more than one partition:
--   the queue is returned for the caller to flag), then the resend record's other
--   field/value pairs.
-- Returns create.lua's reply: {0} or {1, queue} (the queue whose wake-up flag this call
-- set, or with partitions that the caller is to set), or {0, 1, id, "exists"}.
local id, score, created = ARGV[4], ARGV[5], ARGV[6]
if not redis.call('SET', KEYS[1], ARGV[7], 'NX') then return {0, 1, id, 'exists'} end
redis.call('HSET', KEYS[2], 'status', ARGV[1], 'destination', ARGV[2], 'queue', ARGV[3],
  'next_attempt_at', score, 'updated_at', created, unpack(ARGV, 10))
redis.call('ZADD', KEYS[3], score, id)
redis.call('ZADD', KEYS[4], score, id)
redis.call('ZADD', KEYS[5], created, id)
if KEYS[7] then redis.call('SADD', KEYS[7], ARGV[2]) end
if ARGV[8] == '' then return {0} end
if ARGV[9] == '' or redis.call('SET', KEYS[6], ARGV[8], 'NX', 'PX', ARGV[9]) then
  return {1, ARGV[3]}
end
return {0}

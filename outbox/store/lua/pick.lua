-- The first step of a claim with more than one partition (read only, one partition's
-- slot): the due entries of a queue's due index (or its quarantine index: lane "q") that
-- a claim would look at, each with what its resend record says. The caller asks each
-- destination's gate (gate.lua, its home slot) about them, then claims in this partition
-- with the gates' answers (claim_apply.lua), which checks again that each is still due.
--
-- KEYS[1] the queue's due index in the partition  KEYS[2] its quarantine index
-- ARGV: named (lib/args.lua): prefix, parts, now (epoch s), slack (s), scan (most
--   entries), lane ("q" or "")
-- Returns {rows, next_due, next_suspect}: rows flat (id, score, status, destination,
--   "1" when suspect else ""), next_due and next_suspect the first scores of the two
--   indexes (strings), or false.
-- The entries' resend records are keys found at run time: they are checked before the
-- first is read (lib/guard.lua), so that a slot held half-moved with a record already
-- moved answers TRYAGAIN, as a declared key would, rather than "Script attempted to
-- access a non local key".
--! include args
--! include keys
--! include guard
local opts = named_args()
local prefix = K.setup(opts)
local key = opts.lane == 'q' and KEYS[2] or KEYS[1]
local rows = redis.call('ZRANGEBYSCORE', key, '-inf', tonumber(opts.now) + tonumber(opts.slack), 'WITHSCORES', 'LIMIT', 0, tonumber(opts.scan))
local rkeys = {}
for i = 1, #rows, 2 do rkeys[#rkeys + 1] = K.resend(prefix, rows[i]) end
local refused = keys_here(key, rkeys)
if refused then return refused end
local out = {}
for j, rkey in ipairs(rkeys) do
  local v = redis.call('HMGET', rkey, 'status', 'destination', 'suspect')
  out[#out + 1] = rows[2 * j - 1]
  out[#out + 1] = rows[2 * j]
  out[#out + 1] = v[1] or ''
  out[#out + 1] = v[2] or ''
  out[#out + 1] = v[3] and '1' or ''
end
local function first_score(k)
  local first = redis.call('ZRANGE', k, 0, 0, 'WITHSCORES')
  return first[2] or false
end
return {out, first_score(KEYS[1]), first_score(KEYS[2])}

-- Replace the destination summary (outbox/store/reads/summary.py) at once: each of its
-- keys takes the value of its new copy (RENAME), or is deleted when the copy does not
-- exist (a summary of no destination has no rows), so a reader sees one summary or the
-- next, never half of each. Safe to run twice (the second finds no copies: it would
-- delete, so the caller runs it once per copy written).
--
-- KEYS[1..n] the summary's keys; KEYS[n+1..2n] their new copies, in the same order (one
--   slot: the deployment's shared one, {g})
-- ARGV: none. Returns n.
local n = #KEYS / 2
local present = {}
for i = 1, n do present[i] = redis.call('EXISTS', KEYS[n + i]) == 1 end
for i = 1, n do
  if present[i] then
    redis.call('RENAME', KEYS[n + i], KEYS[i])
  else
    redis.call('DEL', KEYS[i])
  end
end
return n

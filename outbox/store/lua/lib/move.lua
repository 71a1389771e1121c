--! needs writes keys
-- A message's index entries moved with a status change, written once for every script
-- that changes statuses by compare-and-set (transition.lua, bulk.lua, release.lua):
-- * its destination's status index: out of `from`'s, into `to`'s at `score`;
-- * its queue's due index holds exactly its pending|retrying messages that are not
--   parked: in when it becomes pending|retrying, out when it stops being one;
-- * its destination's parked set: out when it leaves pending|retrying (or is parked
--   again), in when `park` (it waits there, not in the due index, docs/destinations.md);
-- * its queue's quarantine index (suspects, attempted alone): out when it leaves
--   pending|retrying or moves within them; only claim.lua puts a suspect there.
-- claim.lua takes messages only from the due index, never parked, and moves their three
-- entries itself. Needs lib/writes.lua and lib/keys.lua included before this file (the
-- keys are found at run time: the message's destination and queue are read from its
-- resend record): declared by the `--! needs` line above, which scripts.source checks.
local function waiting(status) return status == 'pending' or status == 'retrying' end

local function move_indexes(prefix, id, dest, queue, from, to, score, park)
  local pp = K.part(prefix, id)  -- the indexes of the message's partition
  zrem_later(K.status(pp, from, dest), id)
  zadd_later(K.status(pp, to, dest), score, id)
  local due_key = K.due(pp, queue)
  if waiting(from) then
    zrem_later(K.parked(pp, dest), id)
    zrem_later(K.quarantine(pp, queue), id)
  end
  if park then
    zadd_later(K.parked(pp, dest), score, id)
  elseif waiting(to) then
    zadd_later(due_key, score, id)
  elseif waiting(from) then
    zrem_later(due_key, id)
  end
end

-- The index keys move_indexes writes for a message of destination `dest`
-- and queue `queue` in partition prefix `pp` moved from `from` to `to` (not parked),
-- added to the list `out`, which is returned.
local function index_keys(out, pp, dest, queue, from, to)
  out[#out + 1] = K.status(pp, from, dest)
  out[#out + 1] = K.status(pp, to, dest)
  if waiting(from) or waiting(to) then out[#out + 1] = K.due(pp, queue) end
  if waiting(from) then
    out[#out + 1] = K.parked(pp, dest)
    out[#out + 1] = K.quarantine(pp, queue)
  end
  return out
end

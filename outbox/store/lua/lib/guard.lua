--! needs keys
-- A script that finds key names at run time (from an index it reads, or from the
-- destination and queue a resend record names) checks them all before its first write,
-- so that a slot held half-moved by a legacy migration (some of its keys moved, the
-- declared ones not) answers TRYAGAIN with nothing written, as a declared key would,
-- instead of the script aborting half-way ("Script attempted to access a non local key")
-- with its earlier writes kept.
--
-- keys_here(anchor, keys) runs EXISTS over `anchor` (a declared key of the slot) and
-- `keys` in one command per chunk. On a cluster node whose slot is being moved, a
-- command of several keys with one of them absent is refused (TRYAGAIN on either node;
-- a command of one key would be served on the importing node as if the key were new),
-- and the refusal is caught here (redis.pcall). Returns nil when the script may go on,
-- else an error reply starting with TRYAGAIN, which the script returns (redis-py raises
-- TryAgainError: a partition in flux, outbox/store/client/outages.py). Keys that exist nowhere
-- (an empty index) are refused too while their slot moves, as declared keys are:
-- https://redis.io/docs/latest/operate/oss_and_stack/reference/cluster-spec/#multi-keys-operations
-- With one partition (no cluster: K.parts is 1) nothing is checked.
-- Needs lib/keys.lua included before this file.
local GUARD_CHUNK = 1000  -- keys per EXISTS: well under unpack's limit

local function keys_here(anchor, keys)
  if K.parts <= 1 or #keys == 0 then return nil end
  local seen, unique = {}, {}
  for _, key in ipairs(keys) do
    if not seen[key] then
      seen[key] = true
      unique[#unique + 1] = key
    end
  end
  for first = 1, #unique, GUARD_CHUNK do
    local r = redis.pcall('EXISTS', anchor, unpack(unique, first, math.min(#unique, first + GUARD_CHUNK - 1)))
    if type(r) == 'table' and r.err then
      return redis.error_reply('TRYAGAIN a key found at run time is not here: ' .. r.err)
    end
  end
  return nil
end

-- Index writes gathered while a script walks its messages, then made as one variadic
-- command per key and kind (ZADD key s1 m1 s2 m2 ..., ZREM key m1 m2 ..., MSET k1 v1
-- k2 v2 ...): a script acting on N messages of one destination writes each index once,
-- not N times. Every command a script runs counts, and costs, as a command (INFO
-- commandstats; Redis docs, "Scripting with Lua"), so this is most of the difference
-- between a batch and N single calls.
--
-- Order is kept where it matters: a member (or MSET key) written again by another kind
-- of write to the same key first flushes everything gathered (ZADD then ZREM of one
-- member stays in that order). Two writes of the same kind to one member go in one
-- call, in order: the later one wins, as it would in two calls. A script must call
-- flush_writes() before it reads an index it gathered writes for, and before it returns.
-- write_at_once(true) makes every later write at once (a script acting on one message:
-- gathering would only add work).
local gathered = {}        -- cmd -> key (or '' for MSET) -> flat args
local gathered_order = {}  -- {cmd, key} in first-use order
local gathered_by = {}     -- key -> member -> cmd that wrote it
local at_once = false
local WRITE_CHUNK = 2000   -- arguments per call: well under unpack's limit (LUAI_MAXCSTACK 8000)

local function write_at_once(yes) at_once = yes end

-- ZREM of `members` (args[first..last]) from `key`, a key that existed when the script
-- began (declared in KEYS, or checked by lib/guard.lua) and that an earlier write of this
-- call may have emptied (its last member removed: the key is deleted). On a slot held
-- half-moved by a legacy migration, a key missing from the migrating slot is a non-local
-- key: any access to it fails ("Script attempted to access a non local key") and the
-- script aborted there, after its writes. That error here means the key is empty: there
-- is nothing to remove. Any other error is raised.
local function zrem_emptied(key, args, first, last)
  local r = redis.pcall('ZREM', key, unpack(args, first, last))
  if type(r) == 'table' and r.err then
    if not string.find(r.err, 'non local key', 1, true) then error(r) end
    return 0
  end
  return r
end

-- The gathered writes, each (command, key) once: first every ZADD and MSET, then every
-- ZREM. Within one flush a member has one kind of write per key (gather() flushes before
-- a member changes kind), so their order does not change what is written; but a ZREM
-- that took an index's last members before a ZADD of new ones would have deleted the key
-- and the ZADD created it again, and creating a key of a slot held half-moved by a legacy
-- migration is a non-local key too: the script aborted after its writes (a claim's
-- message 'sending' and the next one in no index, a promoted ordered message 'pending'
-- in no due index).
local function flush_writes()
  for pass = 1, 2 do
    for _, g in ipairs(gathered_order) do
      local cmd, key = g[1], g[2]
      if (cmd == 'ZREM') == (pass == 2) then
        local args = gathered[cmd][key]
        for first = 1, #args, WRITE_CHUNK do
          local last = math.min(first + WRITE_CHUNK - 1, #args)
          if cmd == 'ZREM' then
            zrem_emptied(key, args, first, last)
          elseif key ~= '' then
            redis.call(cmd, key, unpack(args, first, last))
          else
            redis.call(cmd, unpack(args, first, last))
          end
        end
      end
    end
  end
  gathered, gathered_order, gathered_by = {}, {}, {}
end

local function table_at(t, k)  -- t[k], made an empty table first if absent
  local v = t[k]
  if not v then
    v = {}
    t[k] = v
  end
  return v
end

-- key '' = a command without a key of its own (MSET); value nil = ZREM (member only)
local function gather(cmd, key, member, value)
  local by = table_at(gathered_by, key)
  local prior = by[member]
  if prior and prior ~= cmd then
    flush_writes()
    by = table_at(gathered_by, key)
  end
  local per_key = table_at(gathered, cmd)
  local args = per_key[key]
  if not args then
    args = {}
    per_key[key] = args
    gathered_order[#gathered_order + 1] = {cmd, key}
  end
  if value == nil then
    args[#args + 1] = member                   -- ZREM key member
  elseif key ~= '' then
    args[#args + 1] = value                    -- ZADD key score member
    args[#args + 1] = member
  else
    args[#args + 1] = member                   -- MSET member value
    args[#args + 1] = value
  end
  by[member] = cmd
end

-- Appending without the bookkeeping of gather(), for a script that writes each member
-- once per call and never removes one (create.lua: fresh ids): about 2 us less per
-- message of a send_many(100) than gather()'s member tracking (issue 30, item 10).
-- Same order rule as above for what it appends: flush_writes() writes it.
local function append_later(cmd, key, a, b)
  local per_key = table_at(gathered, cmd)
  local args = per_key[key]
  if not args then
    args = {}
    per_key[key] = args
    gathered_order[#gathered_order + 1] = {cmd, key}
  end
  local n = #args
  args[n + 1], args[n + 2] = a, b
end

local function zadd_once(key, score, member)
  if at_once then redis.call('ZADD', key, score, member) else append_later('ZADD', key, score, member) end
end
local function mset_once(key, value)
  if at_once then redis.call('SET', key, value) else append_later('MSET', '', key, value) end
end

local function zadd_later(key, score, member)
  if at_once then redis.call('ZADD', key, score, member) else gather('ZADD', key, member, score) end
end
local function zrem_later(key, member)
  if at_once then zrem_emptied(key, {member}, 1, 1) else gather('ZREM', key, member) end
end
local function mset_later(key, value)
  if at_once then redis.call('SET', key, value) else gather('MSET', '', key, value) end
end

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

local function flush_writes()
  for _, g in ipairs(gathered_order) do
    local cmd, key = g[1], g[2]
    local args = gathered[cmd][key]
    for first = 1, #args, WRITE_CHUNK do
      local last = math.min(first + WRITE_CHUNK - 1, #args)
      if key ~= '' then
        redis.call(cmd, key, unpack(args, first, last))
      else
        redis.call(cmd, unpack(args, first, last))
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
  if at_once then redis.call('ZREM', key, member) else gather('ZREM', key, member) end
end
local function mset_later(key, value)
  if at_once then redis.call('SET', key, value) else gather('MSET', '', key, value) end
end

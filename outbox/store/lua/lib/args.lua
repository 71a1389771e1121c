-- Named inputs, so a script reads opts.now rather than ARGV[2]
-- (outbox.store.scripts.named builds them on the Python side):
-- * named_args(): ARGV[1] is how many name/value pairs follow, then the pairs. Returns
--   the table name -> value (strings, as Redis passed them) and the position in ARGV of
--   the first argument after them.
-- * row_at(names, pos): ARGV[pos], ARGV[pos + 1], ... named by the list `names` (a
--   record of a repeated group: one message of a create, one change of a transition).
-- * split(text): a comma-separated list as a Lua array ("" = empty).
local function named_args()
  local opts, n = {}, tonumber(ARGV[1])
  for i = 2, 2 * n, 2 do opts[ARGV[i]] = ARGV[i + 1] end
  return opts, 2 * n + 2
end

local function split(text)
  local out = {}
  for s in string.gmatch(text, '[^,]+') do out[#out + 1] = s end
  return out
end

local function row_at(names, pos)
  local row = {}
  for i, name in ipairs(names) do row[name] = ARGV[pos + i - 1] end
  return row
end

-- A positional array (a row of a JSON list the caller built) as a table named by
-- `names`: {'a', 'b'} makes {x, y} into {a = x, b = y}.
local function named_list(values, names)
  local row = {}
  for i, name in ipairs(names) do row[name] = values[i] end
  return row
end

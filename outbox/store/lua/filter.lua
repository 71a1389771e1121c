-- Read only: the ids of a list page or a bulk walk that pass the per-id checks no index
-- serves (queue, last HTTP status code, last error class, created range within a status,
-- and in a batch status and destination; updated and next-attempt ranges), checked where
-- the records are instead of shipping every resend record to the client.
--
-- ARGV: named (lib/args.lua):
--   prefix: of the resend records of ids read from an index (lib/keys.lua)
--   checks: JSON object of the checks, only those that apply:
--     {"status": s, "queue": q, "code": "503", "class": c, "destination": d,
--      "created_lo": x, "created_hi": x, "updated_lo": x, "updated_hi": x,
--      "due_lo": x, "due_hi": x}
--   mode: "ids": the arguments after the named ones are the message ids, in order, and
--           KEYS their resend records, in the same order;
--         "range": KEYS are the sorted sets of an index (one per destination) and the
--           ids are a slice of their union (lib/merge.lua): lo, hi (min and max score,
--           as ZRANGEBYSCORE takes them), offset, count, descending ("1" for highest
--           scores first), after_score and after_id (the entry the slice starts right
--           after; "" and "": the start of the range; a walk's next chunk)
--         "cards": KEYS are sorted sets (of one slot); returns the number of entries of
--           each within lo, hi (ZCARD when both are unbounded, else ZCOUNT), in order:
--           the counts of a partition in one call instead of one command per sorted set.
--   total: "1" in "range" mode: also count the entries of KEYS within lo, hi.
-- Returns {ids that pass, in order; how many ids were examined; in "range" mode the score
-- and id of the last entry examined (false when none was);
-- in "range" mode the scores of the ids that pass, as Redis wrote them, in the same order;
-- with total "1", the entries of KEYS within lo, hi}.
-- A message that is gone never passes. Created times come from the ids
-- (msg_ + 12 hex digits of epoch milliseconds, see outbox.records.new_message_id).
--! include args
--! include keys
--! include merge
local opts, pos = named_args()
local function cards()
  local out = {}
  for i, key in ipairs(KEYS) do
    if opts.lo == '-inf' and opts.hi == '+inf' then
      out[i] = redis.call('ZCARD', key)
    else
      out[i] = redis.call('ZCOUNT', key, opts.lo, opts.hi)
    end
  end
  return out
end
if opts.mode == 'cards' then return cards() end
local prefix = K.setup(opts)
local c = cjson.decode(opts.checks)
local ids
local scores = {}  -- in "range" mode: the score of each of `ids`
local rkeys = nil  -- the resend records of `ids`, when given in KEYS
local last = {false, false}
if opts.mode == 'range' then
  local after = nil
  if opts.after_score ~= '' then after = {opts.after_score, opts.after_id} end
  local slice = merged_range(KEYS, opts.lo, opts.hi, tonumber(opts.offset), tonumber(opts.count), opts.descending == '1', after)
  ids, last, scores = slice[1], {slice[2], slice[3]}, slice[4]
else
  ids, rkeys = {}, KEYS
  for i = pos, #ARGV do ids[#ids + 1] = ARGV[i] end
end
local function within(v, lo, hi)
  if v == nil then return false end
  if lo and v < lo then return false end
  if hi and v > hi then return false end
  return true
end
local check_created = c.created_lo or c.created_hi
local check_updated = c.updated_lo or c.updated_hi
local check_due = c.due_lo or c.due_hi
local reads = c.status or c.queue or c.code or c.class or c.destination or check_updated or check_due
local out, out_scores = {}, {}
for i, id in ipairs(ids) do
  local ok = true
  if check_created then
    local ms = tonumber(string.sub(id, 5, 16), 16)
    ok = within(ms and ms / 1000.0, c.created_lo, c.created_hi)
  end
  if ok and reads then
    local r = redis.call('HMGET', rkeys and rkeys[i] or K.resend(prefix, id), 'status', 'queue', 'last_status_code',
      'last_error_class', 'destination', 'updated_at', 'next_attempt_at')
    ok = r[1] ~= false
    if ok and c.status and r[1] ~= c.status then ok = false end
    if ok and c.queue and (r[2] or '') ~= c.queue then ok = false end
    if ok and c.code and (r[3] or '') ~= c.code then ok = false end
    if ok and c.class and (r[4] or '') ~= c.class then ok = false end
    if ok and c.destination and (r[5] or '') ~= c.destination then ok = false end
    if ok and check_updated and not within(tonumber(r[6]), c.updated_lo, c.updated_hi) then ok = false end
    if ok and check_due and not within(tonumber(r[7]), c.due_lo, c.due_hi) then ok = false end
  end
  if ok then
    out[#out + 1] = id
    out_scores[#out_scores + 1] = scores[i]
  end
end
local total = false
if opts.total == '1' then
  total = 0
  for _, n in ipairs(cards()) do total = total + n end
end
return {out, #ids, last[1], last[2], out_scores, total}

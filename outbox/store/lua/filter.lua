-- Read only: the ids of a list page or a bulk walk that pass the per-id checks no index
-- serves (queue, last HTTP status code, last error class, created range within a status,
-- and in a batch status and destination; updated and next-attempt ranges), checked where
-- the records are instead of shipping every resend record to the client.
--
-- ARGV[1] prefix
-- ARGV[2] JSON object of the checks, only those that apply:
--   {"status": s, "queue": q, "code": "503", "class": c, "destination": d,
--    "created_lo": x, "created_hi": x, "updated_lo": x, "updated_hi": x,
--    "due_lo": x, "due_hi": x}
-- ARGV[3] "ids": ARGV[4..] are the message ids, in order
--         "range": ARGV[4] min score, ARGV[5] max score (as ZRANGEBYSCORE takes them),
--         ARGV[6] offset, ARGV[7] count, ARGV[8] "1" for highest scores first,
--         ARGV[9] and ARGV[10]: the score and id of the entry the slice starts right
--         after ("" and "": the start of the range; a walk's next chunk),
--         ARGV[11..] the sorted sets of an index (one per destination): the ids are
--         that slice of their union (lib/merge.lua)
-- Returns {ids that pass, in order; how many ids were examined; in "range" mode the score
-- and id of the last entry examined (false when none or one sorted set without ARGV[9])}.
-- A message that is gone never passes. Created times come from the ids
-- (msg_ + 12 hex digits of epoch milliseconds, see outbox.records.new_message_id).
--! include merge
local prefix = ARGV[1]
local c = cjson.decode(ARGV[2])
local ids
local last = {false, false}
if ARGV[3] == 'range' then
  local keys = {}
  for i = 11, #ARGV do keys[#keys + 1] = ARGV[i] end
  local after = nil
  if ARGV[9] ~= '' then after = {ARGV[9], ARGV[10]} end
  local slice = merged_range(keys, ARGV[4], ARGV[5], tonumber(ARGV[6]), tonumber(ARGV[7]), ARGV[8] == '1', after)
  ids, last = slice[1], {slice[2], slice[3]}
else
  ids = {}
  for i = 4, #ARGV do ids[#ids + 1] = ARGV[i] end
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
local out = {}
for _, id in ipairs(ids) do
  local ok = true
  if check_created then
    local ms = tonumber(string.sub(id, 5, 16), 16)
    ok = within(ms and ms / 1000.0, c.created_lo, c.created_hi)
  end
  if ok and reads then
    local r = redis.call('HMGET', prefix .. ':resend:' .. id, 'status', 'queue', 'last_status_code',
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
  if ok then out[#out + 1] = id end
end
return {out, #ids, last[1], last[2]}

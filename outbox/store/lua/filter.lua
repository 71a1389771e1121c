-- Read only: the ids of a list page or a bulk walk that pass the per-id checks no index
-- serves (queue, last HTTP status code, last error class, and in a batch status and
-- destination; updated and next-attempt ranges), checked where the records are instead
-- of shipping every resend record to the client.
--
-- ARGV[1] prefix
-- ARGV[2] JSON object of the checks, only those that apply:
--   {"status": s, "queue": q, "code": "503", "class": c, "destination": d,
--    "updated_lo": x, "updated_hi": x, "due_lo": x, "due_hi": x}
-- ARGV[3..] message ids, in order
-- Returns the ids that pass, in order (a message that is gone never passes).
local prefix = ARGV[1]
local c = cjson.decode(ARGV[2])
local out = {}
local function within(raw, lo, hi)
  local v = tonumber(raw)
  if v == nil then return false end
  if lo and v < lo then return false end
  if hi and v > hi then return false end
  return true
end
local check_updated = c.updated_lo or c.updated_hi
local check_due = c.due_lo or c.due_hi
for i = 3, #ARGV do
  local id = ARGV[i]
  local r = redis.call('HMGET', prefix .. ':resend:' .. id, 'status', 'queue', 'last_status_code',
    'last_error_class', 'destination', 'updated_at', 'next_attempt_at')
  local ok = r[1] ~= false
  if ok and c.status and r[1] ~= c.status then ok = false end
  if ok and c.queue and (r[2] or '') ~= c.queue then ok = false end
  if ok and c.code and (r[3] or '') ~= c.code then ok = false end
  if ok and c.class and (r[4] or '') ~= c.class then ok = false end
  if ok and c.destination and (r[5] or '') ~= c.destination then ok = false end
  if ok and check_updated and not within(r[6], c.updated_lo, c.updated_hi) then ok = false end
  if ok and check_due and not within(r[7], c.due_lo, c.due_hi) then ok = false end
  if ok then out[#out + 1] = id end
end
return out

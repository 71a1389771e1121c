-- Alert suppression (outbox.alerts): decides, atomically across all workers, whether an
-- alert about (event, destination) goes out now, and counts the occurrences it reports.
-- The window is a key set with SET NX PX (Redis docs, "SET": NX sets only if absent,
-- PX expires after milliseconds): the first caller in a window wins, every other waits.
--
-- ARGV[1] prefix  ARGV[2] event ("destination.opened", "message.exhausted" ...)
-- ARGV[3] destination  ARGV[4] occurrences to add (0 = a trailing flush: nothing new)
-- ARGV[5] since: epoch seconds of the first of them  ARGV[6] now (epoch seconds)
-- ARGV[7] suppression window (milliseconds)
-- ARGV[8] "1": when suppressed, schedule a trailing flush at the window's end
-- ARGV[9] JSON detail of the newest occurrence ("" with a flush)
-- Keys: <prefix>:alert:sent:<event>:<d>   string, the window (holds its start)
--       <prefix>:alert:count:<event>:<d>  hash n, since, last: occurrences not reported yet
--       <prefix>:alert:flush              sorted set "<event>|<d>" -> when its window ends
-- Returns {1, n, since, last} when the alert goes now (the count is taken and reset),
-- {0} when suppressed (counted), {-1} for a flush that has nothing to report.
local prefix, event, dest = ARGV[1], ARGV[2], ARGV[3]
local add, since, now = tonumber(ARGV[4]), ARGV[5], ARGV[6]
local window_ms, trailing, last = tonumber(ARGV[7]), ARGV[8], ARGV[9]
local KEEP = 7 * 24 * 3600  -- seconds an unreported count is kept
local sent = prefix .. ':alert:sent:' .. event .. ':' .. dest
local count = prefix .. ':alert:count:' .. event .. ':' .. dest
local flush = prefix .. ':alert:flush'
local member = event .. '|' .. dest

if add > 0 then
  redis.call('HINCRBY', count, 'n', add)
  redis.call('HSETNX', count, 'since', since)
  redis.call('HSET', count, 'last', last)
  redis.call('EXPIRE', count, KEEP)
elseif redis.call('EXISTS', count) == 0 then
  redis.call('ZREM', flush, member)
  return {-1}
end
if redis.call('SET', sent, now, 'NX', 'PX', window_ms) then
  local got = redis.call('HMGET', count, 'n', 'since', 'last')
  redis.call('DEL', count)
  redis.call('ZREM', flush, member)
  return {1, tonumber(got[1]), got[2], got[3] or ''}
end
if trailing == '1' then
  local ttl = redis.call('PTTL', sent)
  if ttl < 0 then ttl = 0 end
  redis.call('ZADD', flush, tonumber(now) + ttl / 1000, member)
end
return {0}

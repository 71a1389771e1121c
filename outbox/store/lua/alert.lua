-- Alert suppression (outbox.alerts): decides, atomically across all workers, whether an
-- alert about (event, destination) goes out now, and counts the occurrences it reports.
-- The window is a key set with SET NX PX (Redis docs, "SET": NX sets only if absent,
-- PX expires after milliseconds): the first caller in a window wins, every other waits.
--
-- KEYS[1] outbox:alert:sent:<event>:<d>   string, the window (holds its start)
-- KEYS[2] outbox:alert:count:<event>:<d>  hash n, since, last: occurrences not reported yet
-- KEYS[3] outbox:alert:flush              sorted set "<event>|<d>" -> when its window ends
-- ARGV: named (lib/args.lua): event ("destination.opened", "message.exhausted" ...),
--   destination, add (occurrences to add; 0 = a trailing flush: nothing new), since
--   (epoch seconds of the first of them), now (epoch seconds), window_ms (suppression
--   window), trailing ("1": when suppressed, schedule a trailing flush at the window's
--   end), last (JSON detail of the newest occurrence; "" with a flush)
-- Returns {1, n, since, last} when the alert goes now (the count is taken and reset),
-- {0} when suppressed (counted), {-1} for a flush that has nothing to report.
--! include args
local opts = named_args()
local event, dest = opts.event, opts.destination
local add, since, now = tonumber(opts.add), opts.since, opts.now
local window_ms, trailing, last = tonumber(opts.window_ms), opts.trailing, opts.last
local KEEP = 7 * 24 * 3600  -- seconds an unreported count is kept
local sent, count, flush = KEYS[1], KEYS[2], KEYS[3]
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

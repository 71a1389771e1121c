-- Take out of one index the entries whose message's record disagrees with it: no record
-- (the message is gone), or a status (or destination) the index is not for. Such an
-- entry makes a count lie and a list show a message twice; nothing else removes it (a
-- claim cleans only the due entries it meets, recovery only the sending index). Run by
-- `manage.py outbox_recover --repair-indexes` (outbox/store/maintenance.py), over each
-- index in batches of its members.
--
-- KEYS[1] the index (a destination's status index, or a queue's due, parked or
--   quarantine index); KEYS[2..] the resend record of each id below, in order (one slot:
--   the partition's)
-- ARGV: named (lib/args.lua): statuses (comma-separated: the statuses whose messages
--   belong in this index), destination (the index's destination, "" = any); then the ids
-- Returns the ids taken out.
--! include args
local opts, first = named_args()
local belong = {}
for _, s in ipairs(split(opts.statuses)) do belong[s] = true end
local dest = opts.destination
local removed = {}
for i = first, #ARGV do
  local id = ARGV[i]
  local v = redis.call('HMGET', KEYS[2 + i - first], 'status', 'destination')
  if not v[1] or not belong[v[1]] or (dest ~= '' and v[2] ~= dest) then
    if redis.call('ZREM', KEYS[1], id) == 1 then removed[#removed + 1] = id end
  end
end
return removed

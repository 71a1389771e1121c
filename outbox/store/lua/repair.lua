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
    -- pcall: an entry taken out before may have been the index's last (the key deleted),
    -- and this id is not in it (given twice, as ZSCAN may; or moved out since the caller
    -- read it). On a slot held half-moved by a legacy migration a key that no longer
    -- exists is a non-local key: the script aborted there, after its removals. The index
    -- existed when the call began (declared: a missing one answers TRYAGAIN first), so
    -- that error means it is empty: nothing to take out.
    local r = redis.pcall('ZREM', KEYS[1], id)
    if type(r) == 'table' and r.err and not string.find(r.err, 'non local key', 1, true) then error(r) end
    if r == 1 then removed[#removed + 1] = id end
  end
end
return removed

-- Delete messages in one of the allowed statuses: both records, attempts, every index
-- entry, and the idempotency key if it still points at the message.
--
-- An ordered message leaves its key (lib/ordering.lua): a deleted head lets the next
-- message of its key become the head (the wake checks wake its queue), a deleted
-- blocking dead letter unblocks its key.
-- A delivery of a published event (its resend record's `payload`: the event id) takes
-- its payload record's count of live deliveries down by one, and the record is deleted
-- with the last (create.lua counts them up).
-- KEYS: per id, in order: its resend record, its message record, its attempts list
-- ARGV: named (lib/args.lua): prefix (of the keys found at run time: lib/keys.lua), parts
-- (partitions), statuses (comma-separated allowed statuses), okttl (seconds an ordering
-- key's state is kept after its last message left), now (epoch seconds); then the ids
-- Returns, per id: 1 deleted, 0 refused (status not allowed, or no such message).
--! include args
--! include keys
--! include writes
--! include move
--! include guard
--! include join
--! include ordering
local opts, first = named_args()
local prefix = K.setup(opts)
local allowed = {}
for _, s in ipairs(split(opts.statuses)) do allowed[s] = true end
local out, doomed, doomed_ids, keys, leaving = {}, {}, {}, {}, {}
-- First every read (the records, the idempotency key each names, the next message of a
-- deleted ordered head), and a check that every key the writes may touch is here
-- (lib/guard.lua); then the writes.
for i = first, #ARGV do
  local id = ARGV[i]
  local pp = K.part(prefix, id)
  local k = 3 * (i - first)
  local rkey, mkey, akey = KEYS[k + 1], KEYS[k + 2], KEYS[k + 3]
  local cur = redis.call('HMGET', rkey, 'status', 'destination', 'queue', 'okey', 'payload')
  local status, dest = cur[1], cur[2]
  if status and allowed[status] and not doomed_ids[id] then  -- an id given twice: deleted once
    doomed_ids[id] = true
    local idem
    local head = redis.pcall('GETRANGE', mkey, 0, 4095)  -- the header line of the record's string
    if type(head) == 'table' and head.err then
      idem = redis.call('HGET', mkey, 'idempotency_key')  -- a hash: written by an older version
    elseif head then
      local nl = string.find(head, '\n', 1, true)
      if not nl then
        head = redis.call('GET', mkey)
        nl = string.find(head, '\n', 1, true)
      end
      if nl then
        idem = cjson.decode(string.sub(head, 1, nl - 1)).idempotency_key
        if type(idem) ~= 'string' then idem = nil end
      end
    end
    local queue = cur[3] or ''
    doomed[#doomed + 1] = {id = id, pp = pp, rkey = rkey, mkey = mkey, akey = akey, cur = cur, idem = idem,
                           at = #out + 1}
    if idem then keys[#keys + 1] = K.idempotency(pp, dest, idem) end
    if cur[5] then keys[#keys + 1] = K.payload(pp, cur[5]) end
    for _, key in ipairs({K.due(pp, queue), K.quarantine(pp, queue), K.parked(pp, dest),
                          K.status(pp, status, dest), K.created(pp, dest)}) do
      keys[#keys + 1] = key
    end
    if cur[4] then
      keys[#keys + 1] = K.order_log(pp, dest, cur[4])
      local q = order_key_names(keys, pp, dest, cur[4])
      leaving[q] = (leaving[q] or 0) + 1
    end
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
if #doomed == 0 then return out end
local refused = keys_here(KEYS[1], keys) or heirs_here(prefix, KEYS[1], leaving)
if refused then return refused end
-- First the ordered messages leave their keys, in call order: the next message of a
-- deleted head becomes the head (lib/ordering.lua), into the pending and due indexes;
-- then the messages leave their indexes. In that order no index this call empties (a
-- deleted head the only pending message of its destination, or the only due entry of its
-- queue) is written again after: on a slot held half-moved by a legacy migration, a key
-- that no longer exists is a non-local key, and creating it again aborted the script
-- after its writes (the head's records deleted, the next message 'pending' in no due
-- index). The index removals are gathered (lib/writes.lua: one ZREM per index, and one of
-- an index an earlier removal of this call emptied removes nothing).
for _, d in ipairs(doomed) do
  local id, pp, cur = d.id, d.pp, d.cur
  -- An earlier message of this call may have promoted this one, if it is ordered (a
  -- deleted key head's next message goes from 'waiting' to 'pending', lib/ordering.lua):
  -- its gathered index writes land first, and it is removed from the index of its status
  -- now, not the one it was read in (else its pending and due entries would outlive it).
  d.status = cur[1]
  if cur[4] then
    flush_writes()
    d.status = redis.call('HGET', d.rkey, 'status')
    if d.status and allowed[d.status] then
      order_leave(prefix, pp, cur[2], cur[4], id, nil, tonumber(opts.okttl or '604800'), opts.now or '0')
    end
  end
end
flush_writes()
for _, d in ipairs(doomed) do
  local id, pp, cur, status = d.id, d.pp, d.cur, d.status
  local dest, queue = cur[2], cur[3] or ''
  if status and allowed[status] then
    if d.idem then
      local ikey = K.idempotency(pp, dest, d.idem)
      local held = redis.call('GET', ikey)
      if held and string.sub(held, 1, string.len(id) + 1) == id .. '|' then redis.call('DEL', ikey) end
    end
    zrem_later(K.due(pp, queue), id)
    zrem_later(K.quarantine(pp, queue), id)
    zrem_later(K.parked(pp, dest), id)
    zrem_later(K.status(pp, status, dest), id)
    zrem_later(K.created(pp, dest), id)
    redis.call('DEL', d.rkey, d.mkey, d.akey)
    if cur[5] then
      local pkey = K.payload(pp, cur[5])
      if redis.call('HINCRBY', pkey, 'refs', -1) <= 0 then redis.call('DEL', pkey) end
    end
    if cur[4] then zrem_later(K.order_log(pp, dest, cur[4]), id) end
  else
    out[d.at] = 0
  end
end
flush_writes()
return out

-- Delete messages in one of the allowed statuses: both records, attempts, every index
-- entry, and the idempotency key if it still points at the message.
--
-- An ordered message leaves its key (lib/ordering.lua): a deleted head lets the next
-- message of its key become the head (the wake checks wake its queue), a deleted
-- blocking dead letter unblocks its key.
-- KEYS: per id, in order: its resend record, its message record, its attempts list
-- ARGV: named (lib/args.lua): prefix (of the keys found at run time: lib/keys.lua), parts
-- (partitions), statuses (comma-separated allowed statuses), okttl (seconds an ordering
-- key's state is kept after its last message left), now (epoch seconds); then the ids
-- Returns, per id: 1 deleted, 0 refused (status not allowed, or no such message).
--! include args
--! include keys
--! include writes
--! include move
--! include ordering
local opts, first = named_args()
local prefix = K.setup(opts)
local allowed = {}
for _, s in ipairs(split(opts.statuses)) do allowed[s] = true end
local out = {}
for i = first, #ARGV do
  local id = ARGV[i]
  local pp = K.part(prefix, id)
  local k = 3 * (i - first)
  local rkey, mkey, akey = KEYS[k + 1], KEYS[k + 2], KEYS[k + 3]
  local cur = redis.call('HMGET', rkey, 'status', 'destination', 'queue', 'okey')
  local status, dest = cur[1], cur[2]
  if status and allowed[status] then
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
    if idem then
      local ikey = K.idempotency(pp, dest, idem)
      local held = redis.call('GET', ikey)
      if held and string.sub(held, 1, string.len(id) + 1) == id .. '|' then redis.call('DEL', ikey) end
    end
    redis.call('ZREM', K.due(pp, cur[3] or ''), id)
    redis.call('ZREM', K.quarantine(pp, cur[3] or ''), id)
    redis.call('ZREM', K.parked(pp, dest), id)
    redis.call('ZREM', K.status(pp, status, dest), id)
    redis.call('ZREM', K.created(pp, dest), id)
    redis.call('DEL', rkey, mkey, akey)
    if cur[4] then
      redis.call('ZREM', K.order_log(pp, dest, cur[4]), id)
      order_leave(prefix, pp, dest, cur[4], id, nil, tonumber(opts.okttl or '604800'), opts.now or '0')
    end
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
flush_writes()
return out

-- Delete messages in one of the allowed statuses: both records, attempts, every index
-- entry, and the idempotency key if it still points at the message.
--
-- ARGV[1] prefix, ARGV[2] comma-separated allowed statuses, ARGV[3..] ids
-- Returns, per id: 1 deleted, 0 refused (status not allowed, or no such message).
local prefix = ARGV[1]
local allowed = {}
for s in string.gmatch(ARGV[2], '[^,]+') do allowed[s] = true end
local out = {}
for i = 3, #ARGV do
  local id = ARGV[i]
  local rkey = prefix .. ':resend:' .. id
  local mkey = prefix .. ':message:' .. id
  local cur = redis.call('HMGET', rkey, 'status', 'destination', 'queue')
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
      local ikey = prefix .. ':idempotency:' .. string.len(dest) .. ':' .. dest .. ':' .. idem
      local held = redis.call('GET', ikey)
      if held and string.sub(held, 1, string.len(id) + 1) == id .. '|' then redis.call('DEL', ikey) end
    end
    redis.call('ZREM', prefix .. ':due:' .. (cur[3] or ''), id)
    redis.call('ZREM', prefix .. ':quarantine:' .. (cur[3] or ''), id)
    redis.call('ZREM', prefix .. ':parked:' .. dest, id)
    redis.call('ZREM', prefix .. ':status:' .. status .. ':dest:' .. dest, id)
    redis.call('ZREM', prefix .. ':created:dest:' .. dest, id)
    redis.call('DEL', rkey, mkey, prefix .. ':attempts:' .. id)
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out

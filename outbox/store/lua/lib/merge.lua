-- Entries offset+1 .. offset+count (by rank) of the union of sorted sets, within a score
-- range, in the order one sorted set holding them all would have: by score, ties by
-- member (byte order), lowest first or, when descending, highest first. One sorted set is
-- paged by Redis itself; several are merged here (a heap of their heads: each set is read
-- one entry, then offset + count entries once its first is taken).
-- keys: the sorted sets; lo, hi: score bounds as ZRANGEBYSCORE takes them ("-inf", "(1.5").
-- after: nil, or {score (string, as Redis returned it), member}: start right after that
--   entry instead of at the start of the range (a walk that goes on where its last call
--   stopped, reading count entries of each set instead of offset + count).
-- Returns {members, score of the last entry read or false (none read), that member or false, the
-- scores of members (strings, as Redis returned them), in the same order}.
local function merged_range(keys, lo, hi, offset, count, descending, after)
  if #keys == 1 and not after then
    local rows
    if descending then
      rows = redis.call('ZREVRANGEBYSCORE', keys[1], hi, lo, 'WITHSCORES', 'LIMIT', offset, count)
    else
      rows = redis.call('ZRANGEBYSCORE', keys[1], lo, hi, 'WITHSCORES', 'LIMIT', offset, count)
    end
    local members, texts = {}, {}
    for j = 1, #rows, 2 do
      members[#members + 1] = rows[j]
      texts[#texts + 1] = rows[j + 1]
    end
    if #rows == 0 then return {members, false, false, texts} end
    return {members, rows[#rows], rows[#rows - 1], texts}
  end
  local want = offset + count
  local after_score, after_member
  if after then
    after_score, after_member = tonumber(after[1]), after[2]
    if descending then hi = after[1] else lo = after[1] end
  end
  -- A k-way merge with a binary heap of the sets' heads: each set is read one entry
  -- first, and read up to `want` entries only when its first is taken, so a page of
  -- `want` entries over K sets reads K + want * min(K, want) entries and compares
  -- O(want log K), not want x K (10,000 endpoints' indexes: issue 34, item 6).
  local lists, scores, raw, pos, full, ties = {}, {}, {}, {}, {}, {}
  local function load(i, n)
    local key = keys[i]
    local rows
    if descending then
      rows = redis.call('ZREVRANGEBYSCORE', key, hi, lo, 'WITHSCORES', 'LIMIT', 0, n + ties[i])
    else
      rows = redis.call('ZRANGEBYSCORE', key, lo, hi, 'WITHSCORES', 'LIMIT', 0, n + ties[i])
    end
    local members, values, texts = {}, {}, {}
    for j = 1, #rows, 2 do
      local member, score = rows[j], tonumber(rows[j + 1])
      local seen = after and score == after_score and ((member <= after_member) ~= descending or member == after_member)
      if not seen then
        members[#members + 1] = member
        values[#values + 1] = score
        texts[#texts + 1] = rows[j + 1]
      end
    end
    lists[i], scores[i], raw[i] = members, values, texts
    full[i] = n >= want or #rows < 2 * (n + ties[i])  -- no more to read of it
  end
  local function first(a, b)  -- the head of set a sorts before the head of set b
    local sa, sb = scores[a][pos[a]], scores[b][pos[b]]
    if sa ~= sb then return (sa < sb) ~= descending end
    return (lists[a][pos[a]] < lists[b][pos[b]]) ~= descending
  end
  local heap = {}
  local function down(k)
    local n = #heap
    while true do
      local l, r, m = 2 * k, 2 * k + 1, k
      if l <= n and first(heap[l], heap[m]) then m = l end
      if r <= n and first(heap[r], heap[m]) then m = r end
      if m == k then return end
      heap[k], heap[m] = heap[m], heap[k]
      k = m
    end
  end
  local function up(k)
    while k > 1 do
      local parent = math.floor(k / 2)
      if not first(heap[k], heap[parent]) then return end
      heap[k], heap[parent] = heap[parent], heap[k]
      k = parent
    end
  end
  for i, key in ipairs(keys) do
    ties[i] = 0  -- entries at the cursor's own score, read again and skipped
    if after then ties[i] = redis.call('ZCOUNT', key, after[1], after[1]) end
    pos[i] = 1
    load(i, 1)
    if lists[i][1] then
      heap[#heap + 1] = i
      up(#heap)
    end
  end
  local out, out_scores, taken = {}, {}, 0
  local last_score, last_member = false, false
  while taken < want and #heap > 0 do
    local best = heap[1]
    taken = taken + 1
    if taken > offset then
      out[#out + 1] = lists[best][pos[best]]
      out_scores[#out_scores + 1] = raw[best][pos[best]]
    end
    last_score, last_member = raw[best][pos[best]], lists[best][pos[best]]
    pos[best] = pos[best] + 1
    if lists[best][pos[best]] == nil and not full[best] then load(best, want) end
    if lists[best][pos[best]] == nil then
      heap[1] = heap[#heap]
      heap[#heap] = nil
    end
    if #heap > 0 then down(1) end
  end
  return {out, last_score, last_member, out_scores}
end

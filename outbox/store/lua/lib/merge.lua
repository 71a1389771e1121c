-- Entries offset+1 .. offset+count (by rank) of the union of sorted sets, within a score
-- range, in the order one sorted set holding them all would have: by score, ties by
-- member (byte order), lowest first or, when descending, highest first. One sorted set is
-- paged by Redis itself; several are merged here, reading offset + count entries of each
-- (O(#keys x (offset + count))).
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
  local lists, scores, raw, pos = {}, {}, {}, {}
  for i, key in ipairs(keys) do
    local ties = 0  -- entries at the cursor's own score, read again and skipped below
    if after then ties = redis.call('ZCOUNT', key, after[1], after[1]) end
    local rows
    if descending then
      rows = redis.call('ZREVRANGEBYSCORE', key, hi, lo, 'WITHSCORES', 'LIMIT', 0, want + ties)
    else
      rows = redis.call('ZRANGEBYSCORE', key, lo, hi, 'WITHSCORES', 'LIMIT', 0, want + ties)
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
    lists[i], scores[i], raw[i], pos[i] = members, values, texts, 1
  end
  local out, out_scores, taken = {}, {}, 0
  local last_score, last_member = false, false
  while taken < want do
    local best, best_score, best_member
    for i = 1, #lists do
      local member = lists[i][pos[i]]
      if member then
        local score = scores[i][pos[i]]
        local first = best == nil
        if not first then
          if score ~= best_score then
            first = (score < best_score) ~= descending
          else
            first = (member < best_member) ~= descending
          end
        end
        if first then best, best_score, best_member = i, score, member end
      end
    end
    if not best then break end
    taken = taken + 1
    if taken > offset then
      out[#out + 1] = best_member
      out_scores[#out_scores + 1] = raw[best][pos[best]]
    end
    last_score, last_member = raw[best][pos[best]], best_member
    pos[best] = pos[best] + 1
  end
  return {out, last_score, last_member, out_scores}
end

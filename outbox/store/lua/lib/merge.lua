-- Entries offset+1 .. offset+count (by rank) of the union of sorted sets, within a score
-- range, in the order one sorted set holding them all would have: by score, ties by
-- member (byte order), lowest first or, when descending, highest first. One sorted set is
-- paged by Redis itself; several are merged here, reading offset + count entries of each
-- (O(#keys x (offset + count))).
-- keys: the sorted sets; lo, hi: score bounds as ZRANGEBYSCORE takes them ("-inf", "(1.5").
local function merged_range(keys, lo, hi, offset, count, descending)
  if #keys == 1 then
    if descending then return redis.call('ZREVRANGEBYSCORE', keys[1], hi, lo, 'LIMIT', offset, count) end
    return redis.call('ZRANGEBYSCORE', keys[1], lo, hi, 'LIMIT', offset, count)
  end
  local want = offset + count
  local lists, scores, pos = {}, {}, {}
  for i, key in ipairs(keys) do
    local rows
    if descending then
      rows = redis.call('ZREVRANGEBYSCORE', key, hi, lo, 'WITHSCORES', 'LIMIT', 0, want)
    else
      rows = redis.call('ZRANGEBYSCORE', key, lo, hi, 'WITHSCORES', 'LIMIT', 0, want)
    end
    local members, values = {}, {}
    for j = 1, #rows, 2 do
      members[#members + 1] = rows[j]
      values[#values + 1] = tonumber(rows[j + 1])
    end
    lists[i], scores[i], pos[i] = members, values, 1
  end
  local out, taken = {}, 0
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
    if taken > offset then out[#out + 1] = best_member end
    pos[best] = pos[best] + 1
  end
  return out
end

-- Remove the members a live holder has in one tag that belong to none of its leases: a release
-- lost in a failover (or an AOF restore), an acquire whose result never reached its caller.
-- Then count the holder's members again. Run only when its count exceeds what it holds.
-- Design: docs/design.md (the keys, the holder and lease states, the invariants).
-- KEYS[1]: the tag's holders. ARGV[1]: holder id; ARGV[2..]: the ids of the leases the holder
-- holds in the tag or has in flight there (acquires sent, releases not confirmed).
-- Returns the number of members removed.
local holders = KEYS[1]
local holder = holder_name(ARGV[1])
local index = holders .. ':' .. holder
local keep = {}
for i = 2, #ARGV do
  keep[ARGV[i]] = true
end
local removed = 0
for _, pool in ipairs(redis.call('SMEMBERS', index)) do
  local strays = {}
  for _, member in ipairs(redis.call('ZRANGEBYSCORE', pool, holder, holder)) do
    if not keep[string.match(member, '^[^#]+')] then
      strays[#strays + 1] = member
    end
  end
  -- In slices: unpack has a limit.
  for first = 1, #strays, 1000 do
    removed = removed + redis.call('ZREM', pool, unpack(strays, first, math.min(first + 999, #strays)))
  end
  if redis.call('ZCOUNT', pool, holder, holder) == 0 then
    redis.call('SREM', index, pool)
  end
end
recount(holders, holder)
return removed

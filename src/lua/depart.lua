-- A closing manager's holder leaves the hash tags where it holds nothing any more (release.lua
-- keeps it there for its next acquire): its entry in <tag>:holders and its count of members go
-- (the tag's clock with the last holder), so a closed manager leaves no key behind.
-- Design: docs/design.md (the keys, the holder and lease states, the invariants).
-- KEYS: the holders keys of the tags (one hash slot in a cluster). ARGV[1]: holder id.
-- Returns how many tags it left (a tag where it still has members, a release that failed, is
-- left to the reaper once its entry expires).
local holder = holder_name(ARGV[1])
local left = 0
for _, holders in ipairs(KEYS) do
  local index = holders .. ':' .. holder
  -- release.lua leaves pools in the index: those where the holder has nothing left go first (up
  -- to 1,000 of them; a holder that listed more leaves the rest to the reaper).
  for _, pool in ipairs(call('SRANDMEMBER', index, 1000)) do
    if call('ZCOUNT', pool, holder, holder) == 0 then
      call('SREM', index, pool)
    end
  end
  if call('EXISTS', index) == 0 then
    leave_tag(holders, holder)
    left = left + 1
  end
end
return left

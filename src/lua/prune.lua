-- The second step of a prune (strays.lua lists): remove the members of leases a live holder
-- neither holds nor has in flight, by lease id, from every pool of its index in one tag; then
-- count its members again. A lease id that is neither held nor in flight is never used again
-- (ids are random, one per acquire), so this removes no grant, however late it runs.
-- Design: docs/design.md (the keys, the holder and lease states, the invariants; section 7).
-- KEYS[1]: the tag's holders. ARGV[1]: holder id; then per lease: id, weight w (its members are
-- id, id#2, ..., id#w).
-- Returns the number of members removed.
local holders = KEYS[1]
local holder = holder_name(ARGV[1])
local index = holders .. ':' .. holder
local removed = 0
for _, pool in ipairs(call('SMEMBERS', index)) do
  for i = 2, #ARGV, 2 do
    removed = removed + remove_members(pool, ARGV[i], tonumber(ARGV[i + 1]))
  end
  if call('ZCOUNT', pool, holder, holder) == 0 then
    call('SREM', index, pool)
  end
end
recount(holders, holder)
return removed

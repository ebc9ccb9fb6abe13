-- Check leases one by one after their holder's entry expired or vanished, or grants went missing
-- (a stall, an outage, a restart, a failover; see prelude/holders.lua): a lease still present in
-- every pool is kept; one gone anywhere is cleared, then taken back if every pool has room, and
-- reported lost otherwise: never re-added past a capacity.
-- KEYS: every pool and the holders key of every tag named by the leases below, in any order
-- (one hash slot in a cluster).
-- ARGV[1]: holder id; ARGV[2]: lease duration in ms; then per lease: id and its shape (the
-- prelude's shape_of): weight w, the 1-based KEYS index of its tag's holders, pool count k, and
-- k pairs (1-based KEYS index of the pool, its capacity; 0 = unlimited). A lease of weight w is
-- stored as members id, id#2, ..., id#w.
-- A lease an operator revoked (revoke.lua) is never taken back: it is removed everywhere.
-- Returns {lost, reclaimed, revoked}: the 1-based positions (in ARGV order) of the leases found
-- gone with no room to take them back (now removed everywhere), of those taken back, and of the
-- revoked ones found gone (now removed everywhere).
-- Design: docs/design.md (the keys, the holder and lease states, the invariants).
read_clock()
local holder = holder_name(ARGV[1])
local ttl = tonumber(ARGV[2])
local lost = {}
local reclaimed = {}
local revoked = {}
local position = 0

-- Registered first, so counting room never mistakes this holder's own members for dead ones.
local tags = {}
local i = 3
while i <= #ARGV do
  local holders = KEYS[shape_of(ARGV[i + 1])[2]]
  if not tags[holders] then
    tags[holders] = true
    steady_clock(holders, ttl)
    hold(holders, holder, ttl)
  end
  i = i + 2
end

i = 3
while i <= #ARGV do
  position = position + 1
  local id = ARGV[i]
  local shape = shape_of(ARGV[i + 1])
  local weight, holders, k = shape[1], KEYS[shape[2]], shape[3]
  local keys, capacities = {}, {}
  for j = 1, k do
    keys[j] = KEYS[shape[2 + 2 * j]]
    capacities[j] = shape[3 + 2 * j]
  end

  local held = true
  for j = 1, k do
    if not call('ZSCORE', keys[j], id) then
      held = false
      break
    end
  end

  if not held then
    local is_revoked = call('ZSCORE', holders .. ':revoked', id)
    local room = not is_revoked
    local removed = 0
    for j = 1, k do
      removed = removed + remove_members(keys[j], id, weight)
      local capacity = capacities[j]
      if room and capacity > 0 and used_slots(keys[j], holders, ttl, weight, capacity) + weight > capacity then
        room = false
      end
    end
    if room then
      index_pools(holders, holder, keys, 1, k, nil)
      for j = 1, k do
        add_members(keys[j], holder, id, weight)
      end
      count_members(holders, holder, weight * k - removed, (weight * k - removed) * id_value(id))
      reclaimed[#reclaimed + 1] = position
    else
      count_members(holders, holder, -removed, -removed * id_value(id))
      if is_revoked then
        revoked[#revoked + 1] = position
      else
        lost[#lost + 1] = position
      end
    end
  end
  i = i + 2
end

-- A holder left with no pool in a tag (every lease lost) leaves it. Else its count is taken
-- again from its pools: `hold` dropped the count of an entry found expired, and this call
-- counted only what it added, so the count is exact whatever happens to the next keep-alive
-- (the protocol model checks it: without the recount, a check whose resync never came would
-- leave the count short, and a member a failover brought back would never be pruned).
for holders in pairs(tags) do
  if call('EXISTS', holders .. ':' .. holder) == 0 then
    leave_tag(holders, holder)
  else
    refresh(holders, holder)
    recount(holders, holder)
  end
end
return {lost, reclaimed, revoked}

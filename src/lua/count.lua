-- Count the slots in use in pools of one tag, by live holders (see prelude/reaping.lua): expired
-- holders are reaped first; members of unknown holders are dropped by the walk, at most once a
-- second.
-- KEYS[1..n]: the pools; KEYS[n+1]: their tag's holders. ARGV[1]: the lease duration in ms (for
-- `steady_clock`).
-- Returns the number of members of each pool (a lease of weight w counts w).
-- Design: docs/design.md (the keys, the holder and lease states, the invariants).
read_clock()
local holders = KEYS[#KEYS]
steady_clock(holders, tonumber(ARGV[1]))
reap(holders)
local counts = {}
for i = 1, #KEYS - 1 do
  counts[i] = live_count(KEYS[i], holders)
end
return counts

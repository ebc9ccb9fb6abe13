-- Count the slots in use in one pool, by live holders (see the prelude): expired holders are
-- reaped first; members of unknown holders are dropped by the walk, at most once a second.
-- KEYS[1]: the pool; KEYS[2]: its tag's holders. ARGV[1]: the lease duration in ms (for
-- `steady_clock`).
-- Returns the number of members (a lease of weight w counts w).
-- Design: docs/design.md (the keys, the holder and lease states, the invariants).
read_clock()
steady_clock(KEYS[2], tonumber(ARGV[1]))
reap(KEYS[2])
return live_count(KEYS[1], KEYS[2])

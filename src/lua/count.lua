-- Count the slots in use in one pool, by live holders (see the prelude): expired holders are
-- Design: docs/design.md (the keys, the holder and lease states, the invariants).
-- reaped first; members of unknown holders are dropped by the walk, at most once a second.
-- KEYS[1]: the pool; KEYS[2]: its tag's holders. ARGV: none.
-- Returns the number of members (a lease of weight w counts w).
read_clock()
reap(KEYS[2])
return live_count(KEYS[1], KEYS[2])

-- Count the slots in use in one pool, by live holders only (see the prelude).
-- KEYS[1]: the pool; KEYS[2]: its tag's holders. ARGV: none.
-- Returns the number of members held by live holders (a lease of weight w counts w).
reap(KEYS[2])
return live_count(KEYS[1], KEYS[2])

-- Count the slots in use in one pool, by the server's clock (expired leases do not count).
-- KEYS[1]: the pool. ARGV: none.
-- Returns the number of unexpired members (a lease of weight w counts w).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf')

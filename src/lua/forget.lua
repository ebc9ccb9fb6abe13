-- Forget rate counters: support staff giving an identity a fresh allowance.
-- Design: docs/design.md ("Rate limits").
-- KEYS: the counters (same hash tag). ARGV: none. Returns how many existed.
return call('DEL', unpack(KEYS))

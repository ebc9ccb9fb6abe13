-- The leases revoked in one tag (revoke.lua), for a holder whose keep-alive found the tag's
-- revocation stamp changed: it ends those of them it holds.
-- KEYS[1]: the tag's holders. ARGV: none.
-- Returns the revoked lease ids.
-- Design: docs/design.md (the keys, the holder and lease states, the invariants).
return call('ZRANGE', KEYS[1] .. ':revoked', 0, -1)

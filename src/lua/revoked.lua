-- The leases revoked in one tag (revoke.lua), for a holder whose keep-alive found the tag's
-- revocation stamp changed: it ends those of them it holds, each telling its user's ban.
-- KEYS[1]: the tag's holders. ARGV: none.
-- Returns each revoked lease id, then the ms its user's new streams are still banned for (0:
-- none), both as text.
-- Design: docs/design.md (the keys, the holder and lease states, the invariants).
read_clock()
local revoked = KEYS[1] .. ':revoked'
local ids = call('ZRANGE', revoked, 0, -1)
local reply = {}
-- A thousand ids per HMGET: unpack has a limit of a few thousand values.
for first = 1, #ids, 1000 do
  local last = math.min(first + 999, #ids)
  local ends = call('HMGET', revoked .. ':bans', unpack(ids, first, last))
  for i = first, last do
    reply[#reply + 1] = ids[i]
    reply[#reply + 1] = integer(math.max((tonumber(ends[i - first + 1]) or 0) - now, 0))
  end
end
return reply

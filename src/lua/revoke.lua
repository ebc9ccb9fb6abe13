-- Revoke every live lease of one user, in every process: the leases in the user's own pool are
-- listed as revoked in the tag, the tag's revocation stamp changes, and the tag's holders key is
-- published on the revocations channel. A holder that hears it lists the revoked leases
-- (revoked.lua) and ends and releases those it holds at once; one that missed the message (its
-- subscription was down) finds the stamp changed at its next keep-alive (keepalive.lua), within
-- one renewal period.
-- Nothing is removed here, so no other lease of the user's or of anyone's is touched, and a
-- holder that died frees its slots by expiry as always. With a ban, acquire.lua refuses the
-- user's new streams until it ends.
-- The stamp must never take a value a holder saw before, or that holder would see no change:
-- the key expires (an hour after the last revoke) and a restart or a failover may lose it, so
-- a count made again from 0 would repeat values. So the stamp is the server's TIME in
-- microseconds, or the last stamp plus 1 when that is not above it: it only grows while the
-- key lives, and a key made again starts from the clock, above every stamp made before unless
-- the clock stepped back; holders compare for inequality, so even then only the very
-- microsecond a holder saw last would go unseen.
-- KEYS[1]: the user's own pool; KEYS[2]: its tag's holders (<holders>:revoked is the sorted set
-- of revoked lease ids by the time they are forgotten, <holders>:revoked:bans the hash of those
-- whose user was banned -> when the ban ends, in ms; <holders>:revocations the stamp).
-- ARGV[1]: ban in ms (0: none; a longer ban already set is kept); ARGV[2]: how long the
-- revoked ids are remembered in ms (a holder that was away longer has lost them anyway);
-- ARGV[3]: the revocations channel (a plain one: PUBLISH).
-- Returns the number of leases revoked.
-- Design: docs/design.md (the keys, the holder and lease states, the invariants).
read_clock()
local pool, holders = KEYS[1], KEYS[2]
local ban, remember = tonumber(ARGV[1]), tonumber(ARGV[2])
local revoked, count = holders .. ':revoked', 0
local seen = {}
for _, member in ipairs(call('ZRANGE', pool, 0, -1)) do
  -- A lease of weight w is w members: id, id#2, ..., id#w.
  local id = string.match(member, '^[^#]+')
  if not seen[id] then
    seen[id] = true
    call('ZADD', revoked, now + remember, id)
    count = count + 1
  end
end
call('ZREMRANGEBYSCORE', revoked, '-inf', now)
if count > 0 then
  local revocations = holders .. ':revocations'
  local t = call('TIME')
  local stamp = math.max(tonumber(t[1]) * 1000000 + tonumber(t[2]),
    (tonumber(call('GET', revocations)) or 0) + 1)
  call('SET', revocations, string.format('%.0f', stamp), 'PX', math.max(IDLE_MS, remember))
  call('PEXPIRE', revoked, remember)
  call('PUBLISH', ARGV[3], holders)
end
if ban > 0 then
  local key = pool .. ':ban'
  local left = call('PTTL', key)
  if left < ban then
    call('SET', key, '1', 'PX', ban)
  end
  -- Each revoked lease's end tells its user's ban (revoked.lua), as the ban's refusals do.
  if count > 0 then
    local bans, ends = revoked .. ':bans', integer(now + math.max(left, ban))
    for id in pairs(seen) do
      call('HSET', bans, id, ends)
    end
    call('PEXPIRE', bans, math.max(remember, ban, left))
  end
end
return count

-- Release many leases in one call. Idempotent: releasing a lease that is gone does nothing.
-- Design: docs/design.md (the keys, the holder and lease states, the invariants).
-- KEYS: every pool and the holders key of every tag named by the leases below, in any order
-- (one hash slot in a cluster), then, when ARGV[1] is not empty, the waiting line.
-- ARGV[1]: the channel to publish a wake-up on when someone waits (see the prelude's wake), or
-- ''; ARGV[2]: holder id;
-- then per lease: id, weight, the 1-based KEYS index of its tag's holders, pool count k, and k
-- 1-based KEYS indexes of its pools.
-- A pool where the holder has no member left leaves its pool list (checked once per pool of the
-- batch, not per lease; an empty pool is gone with its last member). The holder stays in the
-- tag's holders with nothing there, so its next acquire finds its entry alive instead of
-- building it again: it leaves when its manager closes (depart.lua), or, if it died, when the
-- reaper finds its entry expired.
-- Returns, per lease in ARGV order, 1 if it was still present in at least one pool, else 0.
local holder = ARGV[2] -- the core's decimal text, as stored
local released = 0
local present_each = {}
-- holders key -> set of the pools touched in its tag, and the members removed there
local touched = {}
local removed_in = {}
local i = 3
while i <= #ARGV do
  local id = ARGV[i]
  local weight = tonumber(ARGV[i + 1])
  local holders = KEYS[tonumber(ARGV[i + 2])]
  local k = tonumber(ARGV[i + 3])
  local pools = touched[holders] or {}
  touched[holders] = pools
  local present = false
  for j = 1, k do
    local key = KEYS[tonumber(ARGV[i + 3 + j])]
    pools[key] = true
    local removed = remove_members(key, id, weight)
    if removed > 0 then
      present = true
      removed_in[holders] = (removed_in[holders] or 0) + removed
    end
  end
  if present then
    released = released + 1
  end
  present_each[#present_each + 1] = present and 1 or 0
  i = i + 4 + k
end
for holders, pools in pairs(touched) do
  count_members(holders, holder, -(removed_in[holders] or 0))
  local index = holders .. ':' .. holder
  for pool in pairs(pools) do
    if redis.call('ZCOUNT', pool, holder, holder) == 0 then
      redis.call('SREM', index, pool)
    end
  end
end
if ARGV[1] ~= '' and released > 0 and redis.call('ZCARD', KEYS[#KEYS]) > 0 then
  wake(ARGV[1], released)
end
return present_each

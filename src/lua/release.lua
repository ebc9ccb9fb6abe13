-- Release many leases in one call. Idempotent: releasing a lease that is gone does nothing.
-- KEYS: every pool named by the leases below (one hash slot in a cluster), then, when ARGV[1] is
-- not empty, the waiting line.
-- ARGV[1]: the channel to PUBLISH a wake-up on when someone waits, or ''; then per lease: id,
-- weight, pool count k, and k 1-based KEYS indexes.
-- Returns the number of leases that were still present in at least one pool.
local released = 0
local i = 2
while i <= #ARGV do
  local id = ARGV[i]
  local weight = tonumber(ARGV[i + 1])
  local k = tonumber(ARGV[i + 2])
  local present = false
  for j = 1, k do
    local key = KEYS[tonumber(ARGV[i + 2 + j])]
    if redis.call('ZREM', key, id) == 1 then
      present = true
    end
    for unit = 2, weight do
      redis.call('ZREM', key, id .. '#' .. unit)
    end
  end
  if present then
    released = released + 1
  end
  i = i + 3 + k
end
if ARGV[1] ~= '' and released > 0 and redis.call('ZCARD', KEYS[#KEYS]) > 0 then
  redis.call('PUBLISH', ARGV[1], released)
end
return released

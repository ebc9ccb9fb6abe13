-- Renew many leases in one call; report the ones that are gone instead of re-adding them.
-- KEYS: every pool named by the leases below (one hash slot in a cluster).
-- ARGV[1]: lease duration in ms; then per lease: id, weight, pool count k, and k 1-based KEYS indexes.
-- A lease is held only if it is unexpired in all its pools; one that is not is removed from all
-- of them (it may already count as free elsewhere) and reported lost.
-- Returns the 1-based positions, in ARGV order, of the leases found lost.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[1])
local expiry = now + ttl
local lost = {}
local touched = {}
local position = 0
local i = 2
while i <= #ARGV do
  position = position + 1
  local id = ARGV[i]
  local weight = tonumber(ARGV[i + 1])
  local k = tonumber(ARGV[i + 2])
  local held = true
  for j = 1, k do
    local score = redis.call('ZSCORE', KEYS[tonumber(ARGV[i + 2 + j])], id)
    if (not score) or tonumber(score) <= now then
      held = false
      break
    end
  end
  for j = 1, k do
    local key = KEYS[tonumber(ARGV[i + 2 + j])]
    if held then
      redis.call('ZADD', key, 'XX', expiry, id)
      for unit = 2, weight do
        redis.call('ZADD', key, 'XX', expiry, id .. '#' .. unit)
      end
      touched[key] = true
    else
      redis.call('ZREM', key, id)
      for unit = 2, weight do
        redis.call('ZREM', key, id .. '#' .. unit)
      end
    end
  end
  if not held then
    lost[#lost + 1] = position
  end
  i = i + 3 + k
end
for key in pairs(touched) do
  if redis.call('PTTL', key) < ttl then
    redis.call('PEXPIRE', key, ttl)
  end
end
return lost

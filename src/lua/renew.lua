-- Renew many leases in one call. A lease found gone is taken back if every pool has room, and
-- reported lost otherwise: never re-added past a capacity.
-- KEYS: every pool named by the leases below (one hash slot in a cluster).
-- ARGV[1]: lease duration in ms; then per lease: id, weight w, pool count k, and k pairs
-- (1-based KEYS index, capacity of that pool; 0 = unlimited).
-- A lease is held only if it is unexpired in all its pools. A lease of weight w is stored as
-- members id, id#2, ..., id#w.
-- Returns {lost, reclaimed}: the 1-based positions (in ARGV order) of the leases found gone with
-- no room to take them back (now removed everywhere), and of those taken back.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[1])
local expiry = now + ttl
local lost = {}
local reclaimed = {}
-- Renewed members per pool, written with one ZADD per pool at the end.
local renewals = {}
local position = 0

local function members(id, weight)
  local all = {id}
  for unit = 2, weight do
    all[unit] = id .. '#' .. unit
  end
  return all
end

local i = 2
while i <= #ARGV do
  position = position + 1
  local id = ARGV[i]
  local weight = tonumber(ARGV[i + 1])
  local k = tonumber(ARGV[i + 2])
  local keys, capacities = {}, {}
  for j = 1, k do
    keys[j] = KEYS[tonumber(ARGV[i + 1 + 2 * j])]
    capacities[j] = tonumber(ARGV[i + 2 + 2 * j])
  end
  local mine = members(id, weight)

  local held = true
  for j = 1, k do
    local score = redis.call('ZSCORE', keys[j], id)
    if (not score) or tonumber(score) <= now then
      held = false
      break
    end
  end

  if not held then
    -- Gone somewhere (expired during an outage, a restart, an eviction): clear what is left,
    -- then take it back only where room allows, in every pool or none.
    local room = true
    for j = 1, k do
      redis.call('ZREM', keys[j], unpack(mine))
      redis.call('ZREMRANGEBYSCORE', keys[j], '-inf', now)
      if capacities[j] > 0 and redis.call('ZCARD', keys[j]) + weight > capacities[j] then
        room = false
      end
    end
    if room then
      reclaimed[#reclaimed + 1] = position
    else
      lost[#lost + 1] = position
    end
    held = room
  end

  if held then
    for j = 1, k do
      local pending = renewals[keys[j]]
      if not pending then
        pending = {}
        renewals[keys[j]] = pending
      end
      for _, member in ipairs(mine) do
        pending[#pending + 1] = expiry
        pending[#pending + 1] = member
      end
    end
  end
  i = i + 3 + 2 * k
end

-- At most 1,000 leases' members per call (the batch bound), in slices well under Lua's
-- argument limit.
for key, pending in pairs(renewals) do
  for first = 1, #pending, 4000 do
    redis.call('ZADD', key, unpack(pending, first, math.min(first + 3999, #pending)))
  end
  if redis.call('PTTL', key) < ttl then
    redis.call('PEXPIRE', key, ttl)
  end
end
return {lost, reclaimed}

-- Acquire one lease in every pool of KEYS at once, all or nothing.
-- KEYS: the pools (sorted sets: member = lease id, score = expiry in ms), all in one hash slot.
-- ARGV[1]: lease id; ARGV[2]: lease duration in ms; ARGV[3]: weight (slots taken in each pool);
-- ARGV[3 + i]: capacity of KEYS[i] (0 = unlimited).
-- A lease of weight w is stored as members id, id#2, ..., id#w so ZCARD is the slots in use.
-- Returns {1, used_1, ..., used_n} (slots in use after the grant), or {0, i, used_i, retry_ms}
-- when KEYS[i] has no room: retry_ms is the time until its earliest lease would expire.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local id = ARGV[1]
local ttl = tonumber(ARGV[2])
local weight = tonumber(ARGV[3])

local used = {}
for i = 1, #KEYS do
  redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now)
  used[i] = redis.call('ZCARD', KEYS[i])
  local capacity = tonumber(ARGV[3 + i])
  if capacity > 0 and used[i] + weight > capacity then
    local retry = ttl
    local first = redis.call('ZRANGE', KEYS[i], 0, 0, 'WITHSCORES')
    if first[2] then
      retry = math.max(tonumber(first[2]) - now, 1)
    end
    return {0, i, used[i], retry}
  end
end

local expiry = now + ttl
local granted = {1}
for i = 1, #KEYS do
  redis.call('ZADD', KEYS[i], expiry, id)
  for unit = 2, weight do
    redis.call('ZADD', KEYS[i], expiry, id .. '#' .. unit)
  end
  -- Idle pools vanish by themselves; never shorten a key another lease still needs.
  if redis.call('PTTL', KEYS[i]) < ttl then
    redis.call('PEXPIRE', KEYS[i], ttl)
  end
  granted[i + 1] = used[i] + weight
end
return granted

-- Keep this process's waiters in the line: refresh their liveness (only those still in line).
-- KEYS[1]: the waiters' liveness (sorted set: waiter id by expiry in ms).
-- ARGV[1]: liveness in ms; ARGV[2..]: waiter ids.
-- Returns the number of waiters refreshed.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local refreshed = 0
for i = 2, #ARGV do
  refreshed = refreshed + redis.call('ZADD', KEYS[1], 'XX', 'CH', now + tonumber(ARGV[1]), ARGV[i])
end
return refreshed

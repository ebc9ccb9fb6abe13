-- Keep one holder's leases alive in many hash tags: one write per tag, whatever the number of
-- leases (see the prelude). Also reaps dead holders and keeps the holder's pools from idling
-- out, a slice per call (SSCAN of its pool list, every pool within a quarter of IDLE_MS).
-- KEYS: <tag>:holders of each tag where the holder has leases (one slot in a cluster).
-- ARGV[1]: holder id; ARGV[2]: lease duration in ms; ARGV[3]: the renewal period in ms;
-- ARGV[3 + i]: the SSCAN cursor of KEYS[i]'s pool list ('0' to start).
-- Returns, per key, {alive, cursor} flattened, as text: alive = '1' if the holder's entry was
-- live and is extended; '0' if it had expired or was gone (its leases must be checked one by one
-- and taken back: the reclaim script). cursor: where the next call goes on.
local holder = holder_name(ARGV[1])
local ttl = tonumber(ARGV[2])
local period = tonumber(ARGV[3])
local reply = {}
for i, holders in ipairs(KEYS) do
  reap(holders)
  local cursor = '0'
  local alive = is_alive(holders, holder)
  if alive then
    hold(holders, holder, ttl)
    local index = holders .. ':' .. holder
    local slice = math.max(16, math.ceil(redis.call('SCARD', index) * period / (IDLE_MS / 4)))
    local scan = redis.call('SSCAN', index, ARGV[3 + i], 'COUNT', slice)
    cursor = scan[1]
    for _, pool in ipairs(scan[2]) do
      redis.call('PEXPIRE', pool, IDLE_MS)
    end
  end
  reply[#reply + 1] = alive and '1' or '0'
  reply[#reply + 1] = cursor
end
return reply

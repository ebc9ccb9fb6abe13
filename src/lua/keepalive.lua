-- Keep one holder's leases alive in many hash tags: one write per tag, whatever the number of
-- Design: docs/design.md (the keys, the holder and lease states, the invariants).
-- leases (see the prelude). Also reaps dead holders and keeps the holder's pools from idling
-- out, a slice per call (SSCAN of its pool list, every pool within a quarter of IDLE_MS).
-- KEYS: <tag>:holders of each tag where the holder has leases (one slot in a cluster).
-- ARGV[1]: holder id; ARGV[2]: lease duration in ms; ARGV[3]: the renewal period in ms;
-- ARGV[4]: '1' to first raise each tag's count of granted members to the figure below (its
-- leases were just checked one by one), else '0'; then per key: the SSCAN cursor of its pool
-- list ('0' to start) and the members the holder knows were granted to it there (sum of
-- weight x pools).
-- Returns, per key, {alive, cursor} flattened, as text: alive = '1' if the holder's entry was
-- live and no grant it knows of is missing, and the entry is extended; '0' otherwise (its
-- leases must be checked one by one and taken back: the reclaim script). cursor: where the
-- next call goes on.
local holder = holder_name(ARGV[1])
local ttl = tonumber(ARGV[2])
local period = tonumber(ARGV[3])
local resync = ARGV[4] == '1'
local reply = {}
for i, holders in ipairs(KEYS) do
  local cursor, known = ARGV[3 + 2 * i], tonumber(ARGV[4 + 2 * i])
  reap(holders)
  local granted = granted_key(holders, holder)
  if resync and tonumber(redis.call('GET', granted) or 0) < known then
    redis.call('SET', granted, known, 'PX', IDLE_MS)
  end
  local alive = is_alive(holders, holder) and tonumber(redis.call('GET', granted) or 0) >= known
  local next_cursor = '0'
  if alive then
    redis.call('ZADD', holders, now + ttl, holder)
    refresh(holders, holder)
    local index = holders .. ':' .. holder
    local slice = math.max(16, math.ceil(redis.call('SCARD', index) * period / (IDLE_MS / 4)))
    local scan = redis.call('SSCAN', index, cursor, 'COUNT', slice)
    next_cursor = scan[1]
    for _, pool in ipairs(scan[2]) do
      redis.call('PEXPIRE', pool, IDLE_MS)
    end
  end
  reply[#reply + 1] = alive and '1' or '0'
  reply[#reply + 1] = next_cursor
end
return reply

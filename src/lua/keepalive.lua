-- Keep one holder's leases alive in many hash tags: one write per tag, whatever the number of
-- leases (see prelude/holders.lua). Also reaps dead holders and gives the holder's pools their
-- idle expiry (an acquire makes a pool without one), a slice per call (SSCAN of its pool list:
-- the whole of a short list, every pool of any within a quarter of IDLE_MS), and drops from
-- that list the pools the holder left (release.lua leaves them there).
-- Design: docs/design.md (the keys, the holder and lease states, the invariants).
-- KEYS: <tag>:holders of each tag where the holder has leases (one slot in a cluster).
-- ARGV[1]: holder id; ARGV[2]: lease duration in ms; ARGV[3]: the renewal period in ms;
-- ARGV[4]: '1' to first count each tag's members again from its pools (its leases were just
-- checked one by one), else '0'; then per key: the SSCAN cursor of its pool list ('0' to start).
-- Returns, per key, {alive, tally, cursor, revocations} flattened, as text: alive = '1'
-- if the holder's entry was live (and is extended), '0' otherwise (its leases must be checked
-- one by one and taken back: the reclaim script); tally: the holder's count of members in the
-- tag and the sum of their ids in one integer (the prelude's TALLY_UNIT), which the process
-- compares with what it holds; cursor: where the next call goes on;
-- revocations: the tag's revocation stamp (revoke.lua; '0' without one), which the process
-- compares with the one it saw last.
local holder = holder_name(ARGV[1])
local ttl = tonumber(ARGV[2])
local period = tonumber(ARGV[3])
local resync = ARGV[4] == '1'
read_clock()
local reply = {}
for i, holders in ipairs(KEYS) do
  local cursor = ARGV[4 + i]
  steady_clock(holders, ttl)
  reap(holders)
  if resync then
    recount(holders, holder)
  end
  local tally = call('GET', members_key(holders, holder)) or '0'
  local count = math.floor(tonumber(tally) / TALLY_UNIT + 0.5)
  local alive = is_alive(holders, holder)
  local next_cursor = '0'
  if alive then
    call('ZADD', holders, now + ttl, holder)
    refresh(holders, holder)
    local index = holders .. ':' .. holder
    local listed = call('SCARD', index)
    local slice = math.max(16, math.ceil(listed * period / (IDLE_MS / 4)))
    -- release.lua leaves pools listed: a pool found gone leaves the index. And when the index
    -- lists more pools than the holder has members (each listed pool where it has some holds
    -- one at least), a bigger slice looks for its members and drops the pools without any, so
    -- the index stays about the size of what the holder holds, however many users come and go.
    local stale = listed - count > 64
    if stale then
      slice = math.max(slice, math.min(1000, listed - count))
    end
    local scan = call('SSCAN', index, cursor, 'COUNT', slice)
    next_cursor = scan[1]
    for _, pool in ipairs(scan[2]) do
      if stale and call('ZCOUNT', pool, holder, holder) == 0 then
        call('SREM', index, pool)
      elseif call('PEXPIRE', pool, IDLE_MS_TEXT) == 0 then
        call('SREM', index, pool)
      end
    end
  end
  reply[#reply + 1] = alive and '1' or '0'
  reply[#reply + 1] = tally
  reply[#reply + 1] = next_cursor
  reply[#reply + 1] = call('GET', holders .. ':revocations') or '0'
end
return reply

-- Prelude: holders, and the members of their leases in pools.
-- A holder is one manager in one process. It keeps every lease it holds in a hash tag alive
-- with one entry in <tag>:holders (sorted set: holder id -> expiry in ms, server clock), so
-- renewal costs one write per process, not one per lease. Pool members are scored by their
-- holder's id; <tag>:holders:<id> (set) lists every pool where that holder has members (and
-- may list pools it left: release.lua leaves them, keepalive.lua drops them), so the
-- leases of a holder that stopped renewing are removed pool by pool ("reaped", reaping.lua), and
-- <tag>:holders:<id>:members (an integer, the holder's tally) counts the members the holder has
-- in the tag and sums their ids (see `id_value`) in one number, each member adding TALLY_UNIT
-- plus its id's value: kept exact by every script that adds or removes one, with one INCRBY, so
-- the holder can tell, both ways, when what Redis holds for it differs from what it holds (a
-- failover that lost the last writes, a reap, a lost release), even when as many members came
-- back as went missing. The count is the tally over TALLY_UNIT, rounded; the sum what is left
-- (the core splits it: `backend/redis/keepalive.rs`), exact while a holder has fewer than 2^19
-- members in a tag (the sum of their ids stays below half of TALLY_UNIT).
local TALLY_UNIT = 17592186044416 -- 2^44
-- Integers a Lua number holds exactly: a tally change beyond them goes to Redis in two parts.
local EXACT_BELOW = 9007199254740992 -- 2^53

-- A holder id as stored in <tag>:holders (scores come back as text in any float format).
local function holder_name(text)
  return string.format('%d', tonumber(text))
end

-- The members of a lease of weight w: id, id#2, ..., id#w (so ZCARD counts slots).
local function member(id, unit)
  return unit == 1 and id or id .. '#' .. unit
end

local function members(id, weight)
  local list = {}
  for unit = 1, weight do
    list[unit] = member(id, unit)
  end
  return list
end

-- The ms a holder's entry has left (0: expired or gone).
local function entry_life(holders, holder)
  need_clock()
  local expiry = call('ZSCORE', holders, holder)
  return expiry and math.max(0, tonumber(expiry) - now) or 0
end

local function is_alive(holders, holder)
  return entry_life(holders, holder) > 0
end

local function members_key(holders, holder)
  return holders .. ':' .. holder .. ':members'
end

-- A holder with no pool left in a tag leaves it (the last one takes the tag's clock and last
-- fencing token along: the next grant's token comes from the clock, see acquire.lua).
local function leave_tag(holders, holder)
  call('ZREM', holders, holder)
  call('DEL', members_key(holders, holder))
  if call('EXISTS', holders) == 0 then
    call('DEL', holders .. ':clock', holders .. ':fencing')
  end
end

-- Keeps a holder's keys from idling out (the keep-alive does it every round).
local function refresh(holders, holder)
  call('PEXPIRE', holders, IDLE_MS_TEXT)
  call('PEXPIRE', holders .. ':' .. holder, IDLE_MS_TEXT)
  call('PEXPIRE', members_key(holders, holder), IDLE_MS_TEXT)
end

-- Registers (or extends) a holder in <tag>:holders; returns whether its entry was live (`alive`:
-- as the caller read it already, if it did). An entry found expired or gone may have been
-- reaped in part: its count goes (from 0 again), so its next keep-alive finds members missing,
-- checks its leases one by one and recounts.
local function hold(holders, holder, ttl, alive)
  need_clock()
  if alive == nil then
    alive = is_alive(holders, holder)
  end
  if not alive then
    call('DEL', members_key(holders, holder))
  end
  call('ZADD', holders, integer(now + ttl), holder)
  return alive
end

-- Lists pools `pools[first..last]` in a holder's index, in one command, before their members go
-- in: the index covers every pool where the holder has members even when a call breaks half way.
-- `indexed`: the pools a batch put in the index already (none is ever taken out meanwhile), or
-- nil.
local function index_pools(holders, holder, pools, first, last, indexed)
  if not indexed then
    call('SADD', holders .. ':' .. holder, unpack(pools, first, last))
    return
  end
  local fresh = {}
  for i = first, last do
    local pool = pools[i]
    if not indexed[pool] then
      fresh[#fresh + 1] = pool
      indexed[pool] = true
    end
  end
  if #fresh > 0 then
    call('SADD', holders .. ':' .. holder, unpack(fresh))
  end
end

-- Adds a lease's members to a pool (listed in the holder's index first: `index_pools`; the
-- caller counts them, once per lease: see `count_members`). A pool made here has no expiry
-- yet: the holder's keep-alive gives every pool of its index its idle expiry (keepalive.lua),
-- and until then the pool lives no longer than its members, which the reaper removes if the
-- holder dies first: a PEXPIRE per new pool would be a sixth of a lone stream's Redis work.
local function add_members(pool, holder, id, weight)
  if weight == 1 then
    call('ZADD', pool, holder, id)
  else
    local args = {}
    for unit = 1, weight do
      args[2 * unit - 1] = holder
      args[2 * unit] = member(id, unit)
    end
    call('ZADD', pool, unpack(args))
  end
end

-- Removes a lease's members from a pool; returns how many were there (the caller counts them
-- down, once per tag or lease: see `count_members`).
local function remove_members(pool, id, weight)
  if weight == 1 then
    return call('ZREM', pool, id)
  end
  return call('ZREM', pool, unpack(members(id, weight)))
end

-- What one member of a lease adds to its holder's sum of ids: the first 24 bits of the lease
-- id (random hex; the core computes the same, `LeaseRecord::id_value`).
local function id_value(member)
  return tonumber(string.sub(member, 1, 6), 16) or 0
end

-- Moves a holder's tally in a tag by `change` members whose ids add up to `ids`.
local function count_members(holders, holder, change, ids)
  if change ~= 0 or ids ~= 0 then
    local key = members_key(holders, holder)
    local moved = change * TALLY_UNIT + ids
    if math.abs(moved) < EXACT_BELOW then
      call('INCRBY', key, integer(moved))
    else
      call('INCRBY', key, integer(change * TALLY_UNIT)) -- exact: few bits times a power of 2
      call('INCRBY', key, integer(ids))
    end
  end
end

-- Moves a holder's tally by a whole lease's `units` members (below 0: taken out): by `tally`, the
-- text the core computed for it, sign included, when given (formatting the number and reading
-- the id's value here cost Redis 5k instructions a lease), else as count_members computes it.
local function count_lease(holders, holder, tally, units, id)
  if tally ~= '' then
    call('INCRBY', members_key(holders, holder), tally)
  else
    count_members(holders, holder, units, units * id_value(id))
  end
end

-- Counts a holder's members in its pools of one tag again, and sums their ids, from the pools
-- themselves.
local function recount(holders, holder)
  local count, ids = 0, 0
  for _, pool in ipairs(call('SMEMBERS', holders .. ':' .. holder)) do
    for _, found in ipairs(call('ZRANGEBYSCORE', pool, holder, holder)) do
      count = count + 1
      ids = ids + id_value(found)
    end
  end
  local key = members_key(holders, holder)
  call('SET', key, integer(ids), 'PX', IDLE_MS_TEXT)
  if count > 0 then
    call('INCRBY', key, integer(count * TALLY_UNIT))
  end
  return count
end

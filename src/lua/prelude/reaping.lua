-- Prelude: reaping, the removal of the members of dead holders, within the call's budget
-- (REAP_BUDGET, calls.lua), and the count of a pool's slots in use by live holders.

-- Pools the reaper visits per call at most.
local REAP_POOLS = 200

-- Removes a holder's members from a pool, as many as the call's budget has left (a lease of
-- weight w is w members); returns whether none of them is left there.
local function remove_held(pool, holder)
  if reap_left <= 0 then
    return false
  end
  local limit = reap_left
  local found = call('ZRANGEBYSCORE', pool, holder, holder, 'LIMIT', 0, limit)
  if #found > 0 then
    call('ZREM', pool, unpack(found))
    reap_left = reap_left - #found
  end
  return #found < limit or call('ZCOUNT', pool, holder, holder) == 0
end

-- Removes the members of holders whose entry expired (the first 16 of them), within the call's
-- budget of members and REAP_POOLS pools. A pool leaves the holder's index once it holds none
-- of the holder's members, so a pool half done stays listed for the next call; the holder
-- leaves <tag>:holders once its index is empty.
local function reap(holders)
  need_clock()
  local pools_left = REAP_POOLS
  for _, holder in ipairs(call('ZRANGEBYSCORE', holders, '-inf', now_text, 'LIMIT', 0, 16)) do
    if reap_left <= 0 or pools_left <= 0 then
      return
    end
    local index = holders .. ':' .. holder
    for _, pool in ipairs(call('SRANDMEMBER', index, pools_left)) do
      pools_left = pools_left - 1
      if not remove_held(pool, holder) then
        break
      end
      call('SREM', index, pool)
    end
    if call('EXISTS', index) == 0 then
      leave_tag(holders, holder)
    end
  end
end

-- Slots in use in a pool that looks full, counting live holders only: drops the members of
-- holders that expired or are gone (the safety net for pools the reaper has not reached, and for
-- holders whose keys were evicted). One step per holder, within the call's budget of members
-- (a walk cut short counts the rest as used, which never admits too many), at most once a
-- second per pool (the <tag>:holders:walked:<pool> marker), so a flood of refusals does not
-- walk it each time.
local function live_count(pool, holders)
  if reap_left > 0 and call('SET', holders .. ':walked:' .. pool, 1, 'PX', 1000, 'NX') then
    local entry = call('ZRANGE', pool, 0, 0, 'WITHSCORES')
    while entry[2] and reap_left > 0 do
      local holder = holder_name(entry[2])
      if not is_alive(holders, holder) then
        remove_held(pool, holder)
      end
      entry = call('ZRANGEBYSCORE', pool, '(' .. holder, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
    end
  end
  return call('ZCARD', pool)
end

-- Slots in use in a pool, for a lease of `weight` that needs room under `capacity` (0 =
-- unlimited): the plain count (or `known`, the count the call has already), recounted by live
-- holders when it looks full (after the clock-step guard, for leases of `lease` ms).
local function used_slots(pool, holders, lease, weight, capacity, known)
  local used = known or call('ZCARD', pool)
  if capacity > 0 and used + weight > capacity then
    steady_clock_once(holders, lease)
    used = live_count(pool, holders)
  end
  return used
end

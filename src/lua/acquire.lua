-- Acquire one lease in every pool at once, all or nothing, first come first served, and count
-- its start against the caller's rate policies in the same step: a start refused for rate takes
-- no slot, a stream refused for a slot consumes no rate.
-- Design: docs/design.md (the keys, the holder and lease states, the invariants).
-- KEYS[1..n]: the pools (sorted sets: member = lease id, score = holder id), all in one hash
-- slot; the first ARGV[8] of them are the caller's own quota (a full one refuses at once, never
-- makes it wait), the others shared capacity. KEYS[n+1]: the tag's holders (see the prelude).
-- With a waiting line (ARGV[6] = 1), KEYS[n+2..n+4]: the line (sorted set: waiter id by
-- ticket), the liveness of the processes that have waiters (sorted set: holder id by expiry in
-- ms; <liveness>:<holder id> is the set of that process's waiters) and the ticket counter.
-- The keys left after those: the caller's rate counters (see hit.lua).
-- ARGV[1]: lease id; ARGV[2]: lease duration in ms; ARGV[3]: weight (slots taken in each pool);
-- ARGV[4]: waiter id, or '' for a caller that will not wait; ARGV[5]: liveness of the waiter's
-- process in ms (its heartbeat extends it);
-- ARGV[6]: 1 if the line's keys follow, else 0; ARGV[7]: the channel to PUBLISH on when a grant
-- leaves others in line (they may fit too); ARGV[8]: how many pools are the caller's own quota
-- (0 or 1); ARGV[9]: holder id; ARGV[10]: n, the number of pools; ARGV[10 + i]: capacity of
-- KEYS[i] (0 = unlimited); then per rate policy: algorithm, limit, window in ms, the units
-- the start takes from it (1 for a request rate, the reservation for a token budget), and '1'
-- for a budget, as in hit.lua.
-- Returns {GRANTED, alive, used_1, ..., used_n, then per rate policy used, reset_ms, bucket, epoch}
-- (alive: 1 if the holder's entry was live when the lease was added, so the holder's other
-- leases in the tag lived on; used: slots in use after the grant; then each rate policy's
-- answer, as hit.lua gives it; a retried call that finds the lease already granted answers
-- with buckets 0); {REFUSED, i, used_i, retry_ms} when KEYS[i] refuses; {RATE_LIMITED, i,
-- retry_ms, then per rate policy used, reset_ms, bucket, epoch} when rate policy i refuses;
-- {WAIT, ticket} when the caller is in line and should wait (ticket: its place, lower is
-- earlier); {BANNED, ms_left} when an operator banned the user's streams (revoke.lua, the key
-- <own pool>:ban). The codes are the prelude's.
local id = ARGV[1]
local ttl = tonumber(ARGV[2])
local weight = tonumber(ARGV[3])
local waiter = ARGV[4]
local queued = ARGV[6] == '1'
local pools = tonumber(ARGV[10])
local holders = KEYS[pools + 1]
local own = tonumber(ARGV[8])
local holder = holder_name(ARGV[9])
local line, alive, tickets = KEYS[pools + 2], KEYS[pools + 3], KEYS[pools + 4]
local first_rate = pools + (queued and 5 or 2)

-- A client that resent this call after a dropped connection must not be refused its own slot,
-- nor sent back in line: checked before any answer but a grant.
local function already_granted()
  if not redis.call('ZSCORE', KEYS[1], id) then
    return nil
  end
  local granted = {GRANTED, is_alive(holders, holder) and 1 or 0}
  for i = 1, pools do
    granted[i + 2] = redis.call('ZCARD', KEYS[i])
  end
  answer_rates(granted, (look_rates(KEYS, first_rate, ARGV, 11 + pools, 0)), false)
  return granted
end

-- A slot frees when a lease is released or, at the latest, when a dead holder expires.
local function refusal(i, used)
  return (waiter == '' and already_granted()) or {REFUSED, i, used, ttl}
end

-- The caller stops waiting (granted or refused): out of the line and of its process's waiters.
local function leave_line()
  if queued and waiter ~= '' then
    redis.call('ZREM', line, waiter)
    redis.call('SREM', alive .. ':' .. holder, waiter)
  end
end

-- The waiters of processes that stopped keeping them alive leave the line.
local function drop_dead_waiters()
  for _, process in ipairs(redis.call('ZRANGEBYSCORE', alive, '-inf', now, 'LIMIT', 0, 16)) do
    local theirs = alive .. ':' .. process
    for _, gone in ipairs(redis.call('SMEMBERS', theirs)) do
      redis.call('ZREM', line, gone)
    end
    redis.call('DEL', theirs)
    redis.call('ZREM', alive, process)
  end
end

-- Puts a waiter in line (or finds it there) and keeps its process alive; returns its ticket
-- and how many wait before it.
local function enter_line()
  local mine = alive .. ':' .. holder
  local ticket = tonumber(redis.call('ZSCORE', line, waiter))
  if not ticket then
    ticket = redis.call('INCR', tickets)
    redis.call('ZADD', line, ticket, waiter)
    redis.call('SADD', mine, waiter)
  end
  redis.call('ZADD', alive, now + tonumber(ARGV[5]), holder)
  for _, key in ipairs({line, alive, tickets, mine}) do
    redis.call('PEXPIRE', key, math.max(ttl, tonumber(ARGV[5])) * 2)
  end
  return ticket, redis.call('ZRANK', line, waiter)
end

-- Slots in use in each pool; on the first full one, the answer to give instead of a grant.
local function check_pools(ticket)
  local used = {}
  for i = 1, pools do
    local capacity = tonumber(ARGV[10 + i])
    used[i] = used_slots(KEYS[i], holders, weight, capacity)
    if capacity > 0 and used[i] + weight > capacity then
      if i <= own or waiter == '' then
        leave_line()
        return used, refusal(i, used[i])
      end
      return used, {WAIT, ticket}
    end
  end
  return used, nil
end

-- Adds the lease's members to every pool for this holder, and takes the start from every rate
-- policy.
local function grant(used, rates)
  local was_alive = hold(holders, holder, ttl)
  local granted = {GRANTED, was_alive and 1 or 0}
  for i = 1, pools do
    add_members(KEYS[i], holders, holder, id, weight, used[i] == 0)
    granted[i + 2] = used[i] + weight
  end
  count_members(holders, holder, weight * pools)
  if not was_alive then
    refresh(holders, holder) -- its keys may be new
  end
  answer_rates(granted, rates, true)
  return granted
end

read_clock()
steady_clock(holders, ttl)
reap(holders)
-- A waiter checks first: a resent call must not put it back in line.
if waiter ~= '' then
  local granted = already_granted()
  if granted then
    return granted
  end
end

-- A banned user: refused before anything else is looked at or taken.
if own > 0 then
  local ban = redis.call('PTTL', KEYS[1] .. ':ban')
  if ban > 0 then
    local granted = waiter == '' and already_granted()
    if granted then
      return granted
    end
    leave_line()
    return {BANNED, ban}
  end
end

-- Over a rate limit: refused before taking a place in line or a slot.
local rates, rate_refused, rate_retry = look_rates(KEYS, first_rate, ARGV, 11 + pools, 1)
if rate_refused > 0 then
  local granted = waiter == '' and already_granted()
  if granted then
    return granted
  end
  leave_line()
  local refused = {RATE_LIMITED, rate_refused, rate_retry}
  answer_rates(refused, rates, false)
  return refused
end

local ahead, ticket = 0, 0
if queued then
  drop_dead_waiters()
  if waiter ~= '' then
    ticket, ahead = enter_line()
  else
    ahead = redis.call('ZCARD', line)
  end
end

local used, instead = check_pools(ticket)
if instead then
  return instead
end
-- Room for this lease, but earlier arrivals go first.
if ahead > 0 then
  if waiter == '' then
    local shared = math.min(own + 1, pools)
    return refusal(shared, used[shared])
  end
  return {WAIT, ticket}
end

local granted = grant(used, rates)
if queued and waiter ~= '' then
  leave_line()
  if redis.call('ZCARD', line) > 0 then
    redis.call('PUBLISH', ARGV[7], 0)
  end
end
return granted

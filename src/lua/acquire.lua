-- Acquire one lease in every pool at once, all or nothing, and count its start against the
-- caller's rate policies in the same step: a start refused for rate takes no slot, a stream
-- refused for a slot consumes no rate. Each capped shared pool has its own line: a request
-- waits (or, not waiting, is refused) only when one of its pools lacks room for it beyond what
-- the earlier waiters for that pool need; waiters for other pools never hold it up.
-- Design: docs/design.md (the keys, the holder and lease states, the invariants).
-- KEYS[1..n]: the pools (sorted sets: member = lease id, score = holder id), all in one hash
-- slot; the first ARGV[8] of them are the caller's own quota (a full one refuses at once, never
-- makes it wait), the others shared capacity. KEYS[n+1]: the tag's holders (see the prelude).
-- With a waiting line (ARGV[6] = 1), KEYS[n+2..n+4]: the line (sorted set: waiter id by
-- ticket; <line>:needs is the hash waiter id -> "<weight> <pool key> ...", the capped shared
-- pools it waits for), the liveness of the processes that have waiters (sorted set: holder id
-- by expiry in ms; <liveness>:<holder id> is the set of that process's waiters) and the ticket
-- counter.
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
    forget_waiters(line, {waiter})
    redis.call('SREM', alive .. ':' .. holder, waiter)
  end
end

-- The capped shared pools of this request, by key -> KEYS index: those a line is kept for.
local function lined_pools()
  local lined = {}
  for i = own + 1, pools do
    if tonumber(ARGV[10 + i]) > 0 then
      lined[KEYS[i]] = i
    end
  end
  return lined
end

-- The waiters of processes that stopped keeping them alive leave the line.
local function drop_dead_waiters()
  for _, process in ipairs(redis.call('ZRANGEBYSCORE', alive, '-inf', now, 'LIMIT', 0, 16)) do
    local theirs = alive .. ':' .. process
    forget_waiters(line, redis.call('SMEMBERS', theirs))
    redis.call('DEL', theirs)
    redis.call('ZREM', alive, process)
  end
end

-- Puts a waiter in line (or finds it there), with what it needs, and keeps its process alive;
-- returns its ticket.
local function enter_line(lined)
  local mine = alive .. ':' .. holder
  local ticket = tonumber(redis.call('ZSCORE', line, waiter))
  if not ticket then
    ticket = redis.call('INCR', tickets)
    redis.call('ZADD', line, ticket, waiter)
    redis.call('SADD', mine, waiter)
    local needs = {weight}
    for key in pairs(lined) do
      needs[#needs + 1] = key
    end
    redis.call('HSET', line .. ':needs', waiter, table.concat(needs, ' '))
  end
  redis.call('ZADD', alive, now + tonumber(ARGV[5]), holder)
  for _, key in ipairs({line, line .. ':needs', alive, tickets, mine}) do
    redis.call('PEXPIRE', key, math.max(ttl, tonumber(ARGV[5])) * 2)
  end
  return ticket
end

-- The slots the waiters ahead of this request (all of them for one that will not wait) need
-- in each of its lined pools, by KEYS index.
local function needed_ahead(lined, ticket)
  local ahead_of = {}
  if not queued or next(lined) == nil then
    return ahead_of
  end
  local upto = waiter ~= '' and ('(' .. ticket) or '+inf'
  local ahead = redis.call('ZRANGEBYSCORE', line, '-inf', upto)
  for first = 1, #ahead, 1000 do
    local some = {unpack(ahead, first, math.min(first + 999, #ahead))}
    for _, needs in ipairs(redis.call('HMGET', line .. ':needs', unpack(some))) do
      if needs then
        local w
        for word in string.gmatch(needs, '%S+') do
          if not w then
            w = tonumber(word)
          elseif lined[word] then
            ahead_of[lined[word]] = (ahead_of[lined[word]] or 0) + w
          end
        end
      end
    end
  end
  return ahead_of
end

-- Slots in use in each pool; on the first pool without room (beyond what the waiters ahead
-- need there), the answer to give instead of a grant.
local function check_pools(ticket, ahead_of)
  local used = {}
  for i = 1, pools do
    local capacity = tonumber(ARGV[10 + i])
    local promised = ahead_of[i] or 0
    used[i] = used_slots(KEYS[i], holders, weight + promised, capacity)
    if capacity > 0 and used[i] + promised + weight > capacity then
      if i <= own or waiter == '' then
        leave_line()
        return used, refusal(i, math.min(capacity, used[i] + promised))
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

local ticket, lined = 0, lined_pools()
if queued then
  drop_dead_waiters()
  if waiter ~= '' then
    ticket = enter_line(lined)
  end
end

local used, instead = check_pools(ticket, needed_ahead(lined, ticket))
if instead then
  return instead
end

local granted = grant(used, rates)
if queued and waiter ~= '' then
  leave_line()
  if redis.call('ZCARD', line) > 0 then
    redis.call('PUBLISH', ARGV[7], 0)
  end
end
return granted

-- Acquire one lease in every pool at once, all or nothing, and count its start against the
-- caller's rate policies in the same step: a start refused for rate takes no slot, a stream
-- refused for a slot consumes no rate. Each capped shared pool has its own line: a request
-- waits (or, not waiting, is refused) only when one of its pools lacks room for it beyond what
-- the waiters before it in that pool's line need; waiters for other pools never hold it up.
-- A pool's line is in order of priority (higher first), then of turns: in fair order users
-- take turns (a user's next waiter gets the turn after the last one served there, or after the
-- user's previous waiter, whichever is later: round robin by user, first come first served
-- within a user); in arrival order the turn is the ticket. Equal places go by waiter id, which
-- the process makes in time order. A user's waiters count against its own quota (see
-- beyond_quota), and a full line gives a user's first waiter the place of the last waiter of
-- the user with the most places there (see make_room).
-- One call decides a batch of such requests, of one holder in one hash slot, one after the other
-- in their order, as as many calls would (packed as the prelude's decide_each says). What a
-- batch needs once is done once: the clock and the reaper, the holder's entry, its count of
-- members, its index of pools, the dead waiters dropped.
-- Design: docs/design.md (the keys, the holder and lease states, the invariants).
-- The helpers above the line `--[[ per call ]]` are defined once, when the library loads (see
-- src/backend/redis/scripts.rs); what follows it runs on every call.
-- The head, what every request of the call shares (see the prelude's decide_each):
-- KEYS[1]: the tag's holders (see the prelude). With a waiting line (head ARGV 2 = 1), KEYS[2..4]:
-- the line, every waiter of every pool (sorted set: waiter id by ticket; <line>:needs is the hash
-- waiter id -> "<weight> <pool key> ...", the capped shared pools it waits for, each with its own
-- line: see the prelude's pool_line), the liveness of the processes that have waiters (sorted
-- set: holder id by expiry in ms; <liveness>:<holder id> is the set of that process's waiters)
-- and the ticket counter. Its ARGV (from ARGV[4]): 1: lease duration in ms; 2: 1 if the line's
-- keys are there, else 0; 3: the channel to publish on (see the prelude's wake) when a grant
-- leaves others in line (they may fit too); 4: holder id; 5: the lines' order, 'fair' or
-- 'arrival'; 6: '1' if a full own pool makes a waiter wait in its own line (wait_for_own_quota)
-- rather than refuses it.
-- Each request's keys and args:
-- keys 1..n: the pools (sorted sets: member = lease id, score = holder id), all in one hash
-- slot; the first `own` (shape 3) of them are the caller's own quota (a full one refuses at once,
-- never makes it wait), the others shared capacity; then the caller's rate counters (see
-- hit.lua).
-- args 1: lease id; 2: waiter id, or '' for a caller that will not wait; 3: its shape (the
-- prelude's shape_of), the numbers: 1: weight (slots taken in each pool); 2: liveness of the
-- waiter's process in ms (its heartbeat extends it); 3: how many pools are the caller's own
-- quota (0 or 1); 4: n, the number of pools; 5: priority (0 to 9, higher first); 5 + i:
-- capacity of pool i (0 = unlimited); 5 + n + i: the waiters its line holds at most (0: no
-- limit); then, from arg 4, per rate policy: algorithm, limit, window in ms, the units the start
-- takes from it (1 for a request rate, the reservation for a token budget), as in hit.lua.
-- Returns {GRANTED, alive, used_1, ..., used_n, then per rate policy used, reset_ms, bucket, epoch}
-- (alive: 1 if the holder's entry was live when the lease was added, so the holder's other
-- leases in the tag lived on; used: slots in use after the grant; then each rate policy's
-- answer, as hit.lua gives it; a retried call that finds the lease already granted answers
-- with buckets 0); {REFUSED, i, used_i, retry_ms} when pool i refuses; {RATE_LIMITED, i,
-- retry_ms, then per rate policy used, reset_ms, bucket, epoch} when rate policy i refuses;
-- {WAIT, ticket, place_1, ..., place_n} when the caller is in line and should wait (its place in
-- the line of each pool, 0 for a pool without one; lower is earlier); {LINE_FULL, i, waiting,
-- retry_ms} when the line of pool i holds max_waiting waiters already and has no place to give
-- up to the caller (see make_room; retry_ms: the time those would take at the line's recent
-- service rate, or a lease duration before it has one), {LINE_FULL, i, waiting, retry_ms, 1} to
-- a waiter whose place there went to another user's first waiter;
-- {BANNED, ms_left} when an operator banned the user's streams (revoke.lua, the key
-- <own pool>:ban). The codes are the prelude's.
-- What the call's head says (see load_head).
local holders, line, alive, tickets, ttl, queued, channel, holder, fair, own_waits
-- The request being decided: where its keys and args are in the call's KEYS and ARGV (its key
-- i is keys[kb + i], its arg j args[ab + j]), and what they say (see load_request).
local keys, kb, key_count, args, ab
local id, waiter, shape, weight, liveness, own, pools, priority, user
local CAPS = 5 -- shape[CAPS + i]: capacity of pool i; shape[CAPS + pools + i]: its line's limit
-- A place in a pool's line: (9 - priority) * TURNS + turn. Places and turns go to Redis as
-- `integer()`: Lua prints numbers with 14 digits.
local TURNS = 2 ^ 48

local function load_head(call_keys, call_args)
  ttl = num(call_args[4])
  queued = call_args[5] == '1'
  holders = call_keys[1]
  line, alive, tickets = nil, nil, nil
  if queued then
    line, alive, tickets = call_keys[2], call_keys[3], call_keys[4]
  end
  channel = call_args[6]
  holder = call_args[7] -- the core's decimal text, as stored (holder_name: scores read back)
  fair = call_args[8] == 'fair'
  own_waits = call_args[9] == '1'
end

local function load_request(call_keys, key_base, keys_of_request, call_args, arg_base)
  keys, kb, key_count, args, ab = call_keys, key_base, keys_of_request, call_args, arg_base
  id = args[ab + 1]
  waiter = args[ab + 2]
  shape = shape_of(args[ab + 3])
  weight, liveness, own, pools, priority = shape[1], shape[2], shape[3], shape[4], shape[5]
  -- Who takes turns with others in fair order: the user (its own pool), else the waiter alone.
  user = own > 0 and keys[kb + 1] or waiter
end

-- The capacity of the request's pool i (0 = unlimited).
local function capacity_of(i)
  return shape[CAPS + i]
end

-- The request's rate policies, from look_rates.
local function request_rates(scale)
  return look_rates(keys, kb + pools + 1, kb + key_count, args, ab + 4, scale)
end

-- What the batch did once already: the holder's entry extended (nil: not yet; else whether it
-- was live before; the first grant's ZADD serves the others, same clock and lease), the members
-- it was granted (counted once, at the end), the pools in its index, the dead waiters dropped,
-- the slots in use in each pool it looked at (kept up to date by its grants and walks, the only
-- changes to a pool during the call, so a shared pool is counted once per batch).
-- Made anew by each call.
local batch
-- The slots in use in each pool of the request being decided (check_pools fills it, grant
-- reads it): one table for every request, since a table made per request cost a fortieth of
-- a batched cycle's instructions.
local USED = {}

-- A client that resent this call after a dropped connection must not be refused its own slot,
-- nor sent back in line: checked before any answer but a grant.
local function already_granted()
  if not call('ZSCORE', keys[kb + 1], id) then
    return nil
  end
  local granted = {GRANTED, is_alive(holders, holder) and 1 or 0}
  for i = 1, pools do
    granted[i + 2] = call('ZCARD', keys[kb + i])
  end
  answer_rates(granted, (request_rates(0)), false)
  return granted
end

-- The caller stops waiting (granted or refused): out of the line and of its process's waiters.
local function leave_line()
  if queued and waiter ~= '' then
    forget_waiters(line, {waiter})
    call('SREM', alive .. ':' .. holder, waiter)
  end
end

-- Refuses the caller with `answer`, out of the line; but a caller that will not wait and
-- resent a call whose grant was made gets that grant again (a waiter was checked first).
local function refuse(answer)
  local granted = waiter == '' and already_granted()
  if granted then
    return granted
  end
  leave_line()
  return answer
end

-- The capped shared pools of this request, by key -> KEYS index: those a line is kept for.
local function lined_pools()
  local lined = {}
  for i = own_waits and 1 or own + 1, pools do
    if capacity_of(i) > 0 then
      lined[keys[kb + i]] = i
    end
  end
  return lined
end

-- The caller's place in a pool's line: in fair order, the turn after the last one served there
-- or after its user's last waiter there, whichever is later; in arrival order its ticket (a
-- caller that will not wait, with no ticket, comes after every waiter of its priority).
local function place_in(pool, ticket)
  local turn
  if not fair then
    turn = ticket > 0 and ticket or TURNS - 1
  else
    local turns = call('HMGET', pool_turns(pool), '', user)
    turn = math.max(tonumber(turns[1]) or 0, tonumber(turns[2]) or 0) + 1
  end
  return (9 - priority) * TURNS + turn
end

-- Whether anyone may be waiting in the line: read once per batch, and true from the moment a
-- request of the batch enters it (a line emptied meanwhile still says true: an empty walk).
local function anyone_may_wait()
  if batch.line_empty == nil then
    batch.line_empty = call('ZCARD', line) == 0
  end
  return not batch.line_empty
end

-- The waiters of processes that stopped keeping them alive leave the line (once per batch; also
-- when the line is empty, so the liveness entries of dead processes never pile up ahead of one
-- that died with waiters in line).
local function drop_dead_waiters()
  if batch.waiters_dropped then
    return
  end
  batch.waiters_dropped = true
  for _, process in ipairs(call('ZRANGEBYSCORE', alive, '-inf', now_text, 'LIMIT', 0, 16)) do
    local theirs = alive .. ':' .. process
    forget_waiters(line, call('SMEMBERS', theirs))
    call('DEL', theirs)
    call('ZREM', alive, process)
  end
end

-- Forgets, a few users at a time, those whose last turn in a pool's line was served: the next
-- waiter of such a user takes the same turn without its entry, and a line that never empties
-- would otherwise keep an entry for every user it ever served. Once the hash is big, each new
-- waiter looks at the next few entries (HSCAN, its cursor kept in the hash's 'sweep' field), so
-- the sweep keeps pace with the entries waiters add.
local TURN_FIELDS = {[''] = true, at = true, gap = true, sweep = true}
local function sweep_turns(turns)
  if call('HLEN', turns) <= 64 then
    return
  end
  local kept = call('HMGET', turns, '', 'sweep')
  local served = tonumber(kept[1]) or 0
  local scan = call('HSCAN', turns, kept[2] or '0', 'COUNT', 16)
  local entries = scan[2]
  for j = 1, #entries, 2 do
    if not TURN_FIELDS[entries[j]] and tonumber(entries[j + 1]) <= served then
      call('HDEL', turns, entries[j])
    end
  end
  call('HSET', turns, 'sweep', scan[1])
end

-- Puts a waiter in line and in the line of each pool it needs (or finds it there), with what
-- it needs ("<weight> <holder id> <user> <pool key> ...": see the prelude's waiter_needs) and
-- its part in its user's counts, and keeps its process alive; returns its ticket.
local function enter_line(lined)
  local mine = alive .. ':' .. holder
  local ticket = tonumber(call('ZSCORE', line, waiter))
  local keep = {line, line .. ':needs', alive, tickets, mine}
  if not ticket then
    batch.line_empty = false
    ticket = call('INCR', tickets)
    call('ZADD', line, ticket, waiter)
    call('SADD', mine, waiter)
    local needs = {weight, holder, user}
    for pool in pairs(lined) do
      local place = place_in(pool, ticket)
      call('ZADD', pool_line(pool), integer(place), waiter)
      count_user(pool_users(pool), user, 1)
      if fair then
        call('HSET', pool_turns(pool), user, integer(place % TURNS))
        sweep_turns(pool_turns(pool))
      end
      needs[#needs + 1] = pool
    end
    call('HSET', line .. ':needs', waiter, table.concat(needs, ' '))
    count_user(line .. ':users', user, weight)
  end
  keep[#keep + 1] = line .. ':users'
  for pool in pairs(lined) do
    keep[#keep + 1] = pool_line(pool)
    keep[#keep + 1] = pool_turns(pool)
    keep[#keep + 1] = pool_users(pool)
  end
  call('ZADD', alive, integer(now + liveness), holder)
  for _, key in ipairs(keep) do
    call('PEXPIRE', key, math.max(ttl, liveness) * 2)
  end
  return ticket
end

-- The slots the waiters before this request (for a caller that will not wait: before the
-- place it would take) keep in a lined pool with `used` slots taken. In line order, a waiter
-- keeps its room when it fits beside those counted so far, or when later requests already took
-- as many slots past it as the pool holds; one that does not fit now may be passed, and is
-- listed in `passing` (charged if this request is granted). So a heavy waiter blocks its line
-- only once a pool's worth of slots went past it, and is never passed beyond that.
local function promised_in(pool, capacity, used, passing)
  local ahead
  if waiter ~= '' then
    local rank = call('ZRANK', pool_line(pool), waiter)
    ahead = (rank and rank > 0) and call('ZRANGE', pool_line(pool), 0, rank - 1) or {}
  else
    ahead = call('ZRANGEBYSCORE', pool_line(pool), '-inf', integer(place_in(pool, 0)))
  end
  local promised = 0
  for first = 1, #ahead, 1000 do
    local some = {unpack(ahead, first, math.min(first + 999, #ahead))}
    local needs = call('HMGET', line .. ':needs', unpack(some))
    local passed = call('HMGET', pool_passed(pool), unpack(some))
    for j, other in ipairs(some) do
      local need = tonumber(string.match(needs[j] or '', '^%d+')) or 0
      if used + promised + need <= capacity or (tonumber(passed[j]) or 0) >= capacity then
        promised = promised + need
      else
        passing[#passing + 1] = {pool, other}
      end
    end
  end
  return promised
end

-- The caller's place in the line of each pool (0 for a pool without one), for its process.
local function places(lined)
  local at = {}
  for i = 1, pools do
    at[i] = 0
  end
  for pool, i in pairs(lined) do
    at[i] = tonumber(call('ZSCORE', pool_line(pool), waiter)) or 0
  end
  return at
end

-- The answer LINE_FULL for the line of `pool` (the request's pool i) with `waiting` waiters:
-- retry after those waiters times the line's mean time between two waiters served (its 'gap'),
-- or a lease duration before it has one.
local function line_full(pool, i, waiting)
  local gap = tonumber(call('HGET', pool_turns(pool), 'gap'))
  return {LINE_FULL, i, waiting, gap and math.ceil(gap * (waiting + 1)) or ttl}
end

-- The weight of the waiters in line of the caller's user (0 without its own pool: then its
-- user is the waiter alone).
local function users_waiting()
  return own > 0 and tonumber(call('ZSCORE', line .. ':users', user)) or 0
end

-- A new waiter's places count against its user's own quota: refused at once (as by a full own
-- pool) when the slots its user holds, its user's waiters and itself would not fit there, for
-- it could never be served. With wait_for_own_quota its user's waiters alone count (it waits
-- for its own slots to free): a quota's worth may wait beyond what the user holds.
local function beyond_quota()
  local capacity = own > 0 and capacity_of(1) or 0
  if capacity == 0 then
    return nil
  end
  local pool, waiting, held = keys[kb + 1], users_waiting(), 0
  if not own_waits then
    held = used_slots(pool, holders, weight + waiting, capacity, batch.used[pool])
    batch.used[pool] = held
  end
  if held + waiting + weight > capacity then
    return {REFUSED, 1, math.min(capacity, held + waiting), ttl}
  end
  return nil
end

-- The last waiter in the line of `pool` (the one to be served last there) of user `who`.
local function last_waiter_of(pool, who)
  local from = 0
  while true do
    local some = call('ZREVRANGE', pool_line(pool), from, from + 99)
    if #some == 0 then
      return nil
    end
    local needs = call('HMGET', line .. ':needs', unpack(some))
    for j, other in ipairs(some) do
      local _, _, of = waiter_needs(needs[j])
      if of == who then
        return other
      end
    end
    from = from + 100
  end
end

-- Takes a waiter out of line to make room for another user's (make_room) and leaves word for
-- its process, in <liveness>:<holder id>:displaced (waiter -> the pool whose line it left):
-- its process's next heartbeat wakes it, and its next call is answered with it (given_up).
local function displace(victim, pool)
  local _, process = waiter_needs(call('HGET', line .. ':needs', victim))
  forget_waiters(line, {victim})
  if process then
    local theirs = alive .. ':' .. process
    call('SREM', theirs, victim)
    call('HSET', theirs .. ':displaced', victim, pool)
    call('PEXPIRE', theirs .. ':displaced', math.max(ttl, liveness) * 2)
  end
end

-- A new waiter and the lines of its pools that hold max_waiting waiters already: in each, a
-- caller whose user has no place there yet takes the place of the last waiter of the user with
-- the most places there, when that user has two or more; else it is refused (LINE_FULL). So one
-- user never keeps another's first waiter out of a line. Every line is looked at before anyone
-- is displaced.
local function make_room(lined)
  local displaced = {}
  for pool, i in pairs(lined) do
    local max_waiting = shape[CAPS + pools + i]
    local waiting = max_waiting > 0 and call('ZCARD', pool_line(pool)) or 0
    if max_waiting > 0 and waiting >= max_waiting then
      local users = pool_users(pool)
      local most = call('ZREVRANGE', users, 0, 0, 'WITHSCORES')
      local victim = not call('ZSCORE', users, user) and tonumber(most[2] or 0) >= 2
        and last_waiter_of(pool, most[1])
      if not victim then
        return line_full(pool, i, waiting)
      end
      displaced[#displaced + 1] = {victim, pool}
    end
  end
  for _, place in ipairs(displaced) do
    displace(place[1], place[2])
  end
  return nil
end

-- A waiter whose place went to another user's first waiter (displace): LINE_FULL for that
-- pool's line, with a fifth number, 1, so its process says why.
local function given_up()
  local marks = alive .. ':' .. holder .. ':displaced'
  local pool = call('HGET', marks, waiter)
  if not pool then
    return nil
  end
  call('HDEL', marks, waiter)
  local index = 1
  for i = 1, pools do
    if keys[kb + i] == pool then
      index = i
    end
  end
  local answer = line_full(pool, index, call('ZCARD', pool_line(pool)))
  answer[5] = 1
  return answer
end

-- A waiter granted: the turns it had are served (fair order goes on from there), and the mean
-- time between two waiters served there moves (by a fifth of the new gap's difference).
local function served(lined)
  for pool in pairs(lined) do
    local turns = pool_turns(pool)
    local place = tonumber(call('ZSCORE', pool_line(pool), waiter))
    if place and fair then
      local last = tonumber(call('HGET', turns, '')) or 0
      call('HSET', turns, '', integer(math.max(last, place % TURNS)))
    end
    local timing = call('HMGET', turns, 'at', 'gap')
    local at, gap = tonumber(timing[1]), tonumber(timing[2])
    if at then
      gap = gap and gap + 0.2 * ((now - at) - gap) or (now - at)
      call('HSET', turns, 'gap', tostring(gap))
    end
    call('HSET', turns, 'at', integer(now))
  end
end

-- Slots in use in each pool, and the waiters this request would pass; on the first pool
-- without room (beyond what the waiters before it keep there), the answer to give instead of a
-- grant.
local function check_pools(ticket, lined)
  -- Nobody waits at all (the usual case): no line to walk.
  local anyone_waits = queued and anyone_may_wait()
  local used, passing = USED, anyone_waits and {} or NONE
  for i = 1, pools do
    local pool, capacity = keys[kb + i], capacity_of(i)
    used[i] = used_slots(pool, holders, weight, capacity, batch.used[pool])
    batch.used[pool] = used[i]
    local promised = 0
    if anyone_waits and i <= own and not lined[pool] and waiter == '' then
      -- The user's waiters keep their room in its own quota (see beyond_quota).
      promised = users_waiting()
    elseif anyone_waits and lined[pool] then
      local passing_here = {}
      promised = promised_in(pool, capacity, used[i], passing_here)
      if used[i] + promised + weight > capacity then
        -- Looks full: counted again by live holders, and what the waiters keep with it.
        used[i] = used_slots(pool, holders, weight + promised, capacity, used[i])
        batch.used[pool] = used[i]
        passing_here = {}
        promised = promised_in(pool, capacity, used[i], passing_here)
      end
      for _, passed in ipairs(passing_here) do
        passing[#passing + 1] = passed
      end
    end
    if capacity > 0 and used[i] + promised + weight > capacity then
      if (i <= own and not own_waits) or waiter == '' then
        -- A slot frees when a lease is released or, at the latest, when a dead holder expires.
        return used, refuse({REFUSED, i, math.min(capacity, used[i] + promised), ttl})
      end
      local wait = {WAIT, ticket}
      for _, place in ipairs(places(lined)) do
        wait[#wait + 1] = place
      end
      return used, wait
    end
  end
  return used, nil, passing
end

-- Adds the lease's members to every pool for this holder, and takes the start from every rate
-- policy.
local function grant(used, rates)
  local first = batch.holder_was_alive == nil
  if first then
    batch.holder_was_alive = hold(holders, holder, ttl)
  end
  local granted = {GRANTED, (batch.holder_was_alive or not first) and 1 or 0}
  for i = 1, pools do
    local pool = keys[kb + i]
    -- Counted first: a grant that fails half way never lets the batch count too few.
    batch.used[pool] = used[i] + weight
    add_members(pool, holders, holder, id, weight, used[i] == 0, batch.indexed)
    granted[i + 2] = used[i] + weight
  end
  batch.granted_members = batch.granted_members + weight * pools
  batch.granted_ids = batch.granted_ids + weight * pools * id_value(id)
  answer_rates(granted, rates, true)
  return granted
end


-- Decides the request loaded.
local function decide()
  -- A waiter checks first: a resent call must not put it back in line; nor one whose place
  -- went to another user's waiter.
  if waiter ~= '' then
    local answer = already_granted() or (queued and given_up())
    if answer then
      return answer
    end
  end

  -- A banned user: refused before anything else is looked at or taken.
  if own > 0 then
    local ban = call('PTTL', keys[kb + 1] .. ':ban')
    if ban > 0 then
      return refuse({BANNED, ban})
    end
  end

  -- Over a rate limit: refused before taking a place in line or a slot.
  local rates, rate_refused, rate_retry = request_rates(1)
  if rate_refused > 0 then
    local refused = {RATE_LIMITED, rate_refused, rate_retry}
    answer_rates(refused, rates, false)
    return refuse(refused)
  end

  -- The capped pools with a line matter only when someone may wait (not the usual case).
  local ticket, lined = 0, NONE
  if queued then
    drop_dead_waiters()
    if waiter ~= '' or anyone_may_wait() then
      lined = lined_pools()
    end
    if waiter ~= '' then
      if not call('ZSCORE', line, waiter) then
        local refused = beyond_quota() or make_room(lined)
        if refused then
          return refused
        end
      end
      ticket = enter_line(lined)
    end
  end

  local used, instead, passing = check_pools(ticket, lined)
  if instead then
    return instead
  end

  local granted = grant(used, rates)
  for _, passed in ipairs(passing) do
    call('HINCRBY', pool_passed(passed[1]), passed[2], weight)
    call('PEXPIRE', pool_passed(passed[1]), math.max(ttl, liveness) * 2)
  end
  if queued and waiter ~= '' then
    served(lined)
    leave_line()
    if call('ZCARD', line) > 0 then
      wake(channel, 0)
    end
  end
  return granted
end

-- Loads and decides one request of the call.
local function decide_request(call_keys, key_base, keys_of_request, call_args, arg_base)
  load_request(call_keys, key_base, keys_of_request, call_args, arg_base)
  return decide()
end

--[[ per call ]]
-- The call decides each request in order (the prelude's decide_each packs and unpacks them);
-- the clock, the reaper and the holder's count of members (and sum of ids) are seen to once.
batch = {holder_was_alive = nil, granted_members = 0, granted_ids = 0, indexed = {}, waiters_dropped = false, used = {}}
load_head(KEYS, ARGV)
read_clock()
steady_clock(holders, ttl)
reap(holders)
local replies = decide_each(KEYS, ARGV, decide_request)
count_members(holders, holder, batch.granted_members, batch.granted_ids)
if batch.holder_was_alive == false then
  refresh(holders, holder) -- its keys may be new
end
return replies

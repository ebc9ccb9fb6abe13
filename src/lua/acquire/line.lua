-- acquire.lua, second part: the waiting lines of capped shared pools. A request that does not
-- fit waits in the line of each such pool it needs, in order of priority, then of turns (fair
-- order: round robin by user) or tickets (arrival order); it is served when every one of its
-- pools has room beyond what the waiters before it keep there. The keys of a line and how a
-- waiter leaves one are the prelude's (prelude/lines.lua); the request being decided is
-- acquire/requests.lua's.

-- A place in a pool's line: (9 - priority) * TURNS + turn. Places and turns go to Redis as
-- `integer()`: Lua prints numbers with 14 digits.
local TURNS = 2 ^ 48

-- The caller stops waiting (granted or refused): out of the line and of its process's waiters.
local function leave_line()
  if queued and waiter ~= '' then
    forget_waiters(line, {waiter})
    call('SREM', alive .. ':' .. holder, waiter)
  end
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

-- The waiters of processes that stopped keeping them alive leave the line (once per batch, when
-- someone may wait: a process that died with no waiter left leaves only its liveness entry,
-- taken out, 16 at a time and oldest first, once the line has waiters again).
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
    held = used_slots(pool, holders, ttl, weight + waiting, capacity, batch.used[pool])
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

-- Prelude of every script: src/backend/redis/scripts.rs puts it once in front of the function
-- library of all of them (or in front of each, where a script runs on its own).
-- Design: docs/design.md (the keys, the holder and lease states, the invariants).
-- A holder is one manager in one process. It keeps every lease it holds in a hash tag alive
-- with one entry in <tag>:holders (sorted set: holder id -> expiry in ms, server clock), so
-- renewal costs one write per process, not one per lease. Pool members are scored by their
-- holder's id; <tag>:holders:<id> (set) lists every pool where that holder has members (and
-- may list pools it left: release.lua leaves them, keepalive.lua drops them), so the
-- leases of a holder that stopped renewing are removed pool by pool ("reaped"), and
-- <tag>:holders:<id>:members (hash) counts the members the holder has in the tag ('n') and sums
-- their ids ('s', see `id_value`), kept exact by every script that adds or removes one, so the
-- holder can tell, both ways, when what Redis holds for it differs from what it holds (a
-- failover that lost the last writes, a reap, a lost release), even when as many members came
-- back as went missing.
-- redis.call, kept in a local by begin_call (a library loads without it): reached through the
-- globals on every command, it cost two table lookups each time.
local call
-- Numbers go to commands as integer text: Lua would print them with printf's %.14g, which costs
-- a few thousand instructions per argument.
local function integer(n)
  return string.format('%d', n)
end
-- What a text of ARGV says, parsed once per library load: Lua's tonumber runs strtod, ~1.5k
-- instructions, and a call reads the same few texts again and again. `memoized(parse)` keeps
-- what `parse` made of each text; only for texts of few values (not ids, not scores): the memo
-- starts over past 1,000 texts.
local function memoized(parse)
  local kept, count = {}, 0
  return function(text)
    local value = kept[text]
    if value == nil then
      value = parse(text)
      if count >= 1000 then
        kept, count = {}, 0
      end
      kept[text], count = value, count + 1
    end
    return value
  end
end
-- A number (durations, counts, capacities, KEYS indexes). Wrapped: like redis.call, tonumber
-- itself is not there while a library loads.
local num = memoized(function(text) return tonumber(text) end)
-- A request's shape: the numbers that say what it is, in one argument ("1 30000 1 2 0 3 0 0 0"
-- is a list of nine numbers), so that a call carries one text per request for them instead of
-- one per number (each argument costs Redis about a thousand instructions to take in) and a
-- batch of alike requests parses it once. Non-negative integers only (a sign or a fraction
-- would shift every number after it; the core's `Shape` takes unsigned integers alone).
local shape_of = memoized(function(text)
  local shape = {}
  for word in string.gmatch(text, '%d+') do
    shape[#shape + 1] = tonumber(word)
  end
  return shape
end)
-- An empty list that is never filled: what a request without waiters or rate policies gets
-- instead of a table of its own (a table costs ~1k instructions to make and collect).
local NONE = {}
-- The server's time in ms, read by `read_clock()` in the scripts that need it (not in release
-- or leave, which run for every stream), as a number and as text.
local now, now_text
local function read_clock()
  local t = call('TIME')
  local ms = math.floor(tonumber(t[2]) / 1000)
  now = tonumber(t[1]) * 1000 + ms
  now_text = t[1] .. string.format('%03d', ms)
end
-- Keys live an hour past their last write: those of a fleet that died vanish by themselves,
-- and live holders refresh theirs (acquires, keepalives).
local IDLE_MS = 3600000
local IDLE_MS_TEXT = IDLE_MS .. '' -- as text (string.format is absent while a library loads)
-- Members of dead holders removed per call at most, by the reaper and the walks together, so
-- one call never blocks Redis for long however many members a holder left; the rest goes on
-- the next calls. And pools the reaper visits per call at most.
local REAP_BUDGET = 1000
local REAP_POOLS = 200
local reap_left = REAP_BUDGET
-- In the function library (src/backend/redis/scripts.rs) every script shares this prelude's
-- state across calls; each call starts here (a script of its own too, though its state is new).
local function begin_call()
  call = redis.call
  now, now_text = nil, nil
  reap_left = REAP_BUDGET
end
-- The acquire script's reply codes (mirrored in src/backend/redis/mod.rs).
local REFUSED, GRANTED, WAIT, RATE_LIMITED, BANNED, LINE_FULL, FAILED = 0, 1, 2, 3, 4, 5, 6

-- The text of an error a pcall caught: a command's error is {err = ...}.
local function error_text(e)
  return type(e) == 'table' and e.err or tostring(e)
end

-- A call that decides a batch of requests (acquire.lua, hit.lua): ARGV[1] = m, the number of
-- requests; ARGV[2] and ARGV[3]: how many keys and arguments the head has, what every request
-- of the batch shares (acquire.lua's tag, line, holder...: sent once, read by the script
-- itself), its arguments from ARGV[4] on and its keys first in KEYS; then for each request r,
-- how many keys and arguments it has; then the requests' arguments, in order; then (in KEYS,
-- after the head's) their keys, in order. Calls decide(KEYS, kb, kn, ARGV, ab) for each, in
-- order: the request's keys are KEYS[kb + 1 .. kb + kn], its arguments ARGV[ab + 1 ..] (read in
-- place: a copy per request would cost more than the rest of its decision). Returns each one's
-- reply; a request whose decision failed (a key of another type, say) gets {FAILED, message}
-- (as an error reply it would fail the whole reply in a client), and the others are decided
-- all the same.
local function decide_each(batch_keys, batch_argv, decide)
  local requests = num(batch_argv[1])
  local counts = 3 + num(batch_argv[3]) -- ARGV[counts + 2r - 1], ARGV[counts + 2r]: request r's
  local replies = {}
  local key_base, arg_base = num(batch_argv[2]), counts + 2 * requests
  for r = 1, requests do
    local key_count = num(batch_argv[counts + 2 * r - 1])
    local arg_count = num(batch_argv[counts + 2 * r])
    local decided, reply = pcall(decide, batch_keys, key_base, key_count, batch_argv, arg_base)
    if decided then
      replies[r] = reply
    else
      replies[r] = {FAILED, error_text(reply)}
    end
    key_base, arg_base = key_base + key_count, arg_base + arg_count
  end
  return replies
end

-- Steps of the server's clock (docs/design.md, "Clock steps"). Expiries are server wall-clock
-- times, so a forward step (NTP, an operator, a promoted replica whose clock runs ahead) would
-- make live holders look dead. Each tag keeps the time a script last read the clock there
-- (<tag>:holders:clock, written at most every CLOCK_GRAIN ms); a live holder calls at least
-- every renewal period (at most half a lease), so a call that finds more than half a lease
-- since then grants every holder of the tag the excess (their expiries move forward by it),
-- and a step back moves them back. The price: after a tag was quiet for longer than half a
-- lease, the slots of a holder that died meanwhile free up at most half a lease later.
local CLOCK_GRAIN = 100
local function steady_clock(holders, lease)
  local clock = holders .. ':clock'
  local last = tonumber(call('GET', clock))
  local step = last and now - last or 0
  local shift = 0
  if step > lease / 2 then
    shift = step - math.floor(lease / 2)
  elseif step < 0 then
    shift = step
  end
  if shift ~= 0 then
    -- In slices of 500 holders: unpack has a limit.
    local entries = call('ZRANGE', holders, 0, -1, 'WITHSCORES')
    for first = 1, #entries, 1000 do
      local args = {}
      for i = first, math.min(first + 998, #entries - 1), 2 do
        args[#args + 1] = tonumber(entries[i + 1]) + shift
        args[#args + 1] = entries[i]
      end
      call('ZADD', holders, 'XX', unpack(args))
    end
  end
  if not last or step >= CLOCK_GRAIN or shift ~= 0 then
    call('SET', clock, now_text, 'PX', IDLE_MS_TEXT)
  end
end

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

local function is_alive(holders, holder)
  local expiry = call('ZSCORE', holders, holder)
  return expiry and tonumber(expiry) > now
end

local function members_key(holders, holder)
  return holders .. ':' .. holder .. ':members'
end

-- A holder with no pool left in a tag leaves it (the last one takes the tag's clock along).
local function leave_tag(holders, holder)
  call('ZREM', holders, holder)
  call('DEL', members_key(holders, holder))
  if call('EXISTS', holders) == 0 then
    call('DEL', holders .. ':clock')
  end
end

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
-- holders when it looks full.
local function used_slots(pool, holders, weight, capacity, known)
  local used = known or call('ZCARD', pool)
  if capacity > 0 and used + weight > capacity then
    used = live_count(pool, holders)
  end
  return used
end

-- The line of one capped shared pool (sorted set: waiter id by its place, see acquire.lua),
-- and its turns (hash: user -> the turn of its last waiter there; '' -> the last turn served;
-- 'at', 'gap': when a waiter was last served and the mean time between two; 'sweep': see
-- acquire.lua's sweep_turns).
-- '|' is in no pool name nor key prefix.
local function pool_line(pool)
  return pool .. '|line'
end

local function pool_turns(pool)
  return pool .. '|turns'
end

-- How many slots later requests took past each waiter of a pool's line that did not fit (hash:
-- waiter id -> slots; see acquire.lua's promised_in).
local function pool_passed(pool)
  return pool .. '|passed'
end

-- How many places each user has in a pool's line (sorted set: user -> places; see acquire.lua's
-- make_room).
local function pool_users(pool)
  return pool .. '|users'
end

-- What a waiter of the line is, from its entry in <line>:needs ("<weight> <holder id> <user>
-- <pool key> ...", see acquire.lua's enter_line): its weight, the process it waits in, its user
-- (its own pool's key, or the waiter id without one), and an iterator over the capped pools it
-- waits for.
local function waiter_needs(entry)
  local words = string.gmatch(entry or '', '%S+')
  return tonumber(words() or '0'), words(), words(), words
end

-- Moves a user's count in a sorted set of counts (<line>:users, a pool's users) by `change`,
-- dropping the user at 0.
local function count_user(counts, user, change)
  if tonumber(call('ZINCRBY', counts, change, user)) <= 0 then
    call('ZREM', counts, user)
  end
end

-- Takes waiters out of the line, and of the lines of the pools they wait for, and forgets what
-- they need and their part in their user's counts (<line>:users, each pool's users). A pool's
-- line left empty forgets its turns and users.
local function forget_waiters(line, waiters)
  for first = 1, #waiters, 1000 do
    local some = {unpack(waiters, first, math.min(first + 999, #waiters))}
    local needs = call('HMGET', line .. ':needs', unpack(some))
    for j, waiter in ipairs(some) do
      local weight, _, user, pools = waiter_needs(needs[j])
      if user then
        count_user(line .. ':users', user, -weight)
      end
      for pool in pools do
        if call('ZREM', pool_line(pool), waiter) == 1 and user then
          count_user(pool_users(pool), user, -1)
        end
        call('HDEL', pool_passed(pool), waiter)
        if call('EXISTS', pool_line(pool)) == 0 then
          call('DEL', pool_turns(pool), pool_passed(pool), pool_users(pool))
        end
      end
    end
    call('ZREM', line, unpack(some))
    call('HDEL', line .. ':needs', unpack(some))
  end
end

-- Wakes the waiters of every process. On a Redis Cluster the channel is sharded (its name comes
-- with a leading '!'): SPUBLISH reaches the SSUBSCRIBEd listeners on the slot's own node
-- instead of every node of the cluster.
local function wake(channel, message)
  if string.sub(channel, 1, 1) == '!' then
    call('SPUBLISH', string.sub(channel, 2), message)
  else
    call('PUBLISH', channel, message)
  end
end

-- Keeps a holder's keys from idling out (the keep-alive does it every round).
local function refresh(holders, holder)
  call('PEXPIRE', holders, IDLE_MS_TEXT)
  call('PEXPIRE', holders .. ':' .. holder, IDLE_MS_TEXT)
  call('PEXPIRE', members_key(holders, holder), IDLE_MS_TEXT)
end

-- Registers (or extends) a holder in <tag>:holders; returns whether its entry was live. An
-- entry found expired or gone may have been reaped in part: its count goes (from 0 again), so
-- its next keep-alive finds members missing, checks its leases one by one and recounts.
local function hold(holders, holder, ttl)
  local alive = is_alive(holders, holder)
  if not alive then
    call('DEL', members_key(holders, holder))
  end
  call('ZADD', holders, integer(now + ttl), holder)
  return alive
end

-- Adds a lease's members to a pool for a holder (the caller counts them, once per lease: see
-- `count_members`). A new pool gets its idle expiry (the keep-alive refreshes the holder's
-- pools).
local function add_members(pool, holders, holder, id, weight, new_pool, indexed)
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
  if new_pool then
    call('PEXPIRE', pool, IDLE_MS_TEXT)
  end
  -- `indexed`: the pools a batch put in the index already (none is ever taken out meanwhile).
  if not (indexed and indexed[pool]) then
    call('SADD', holders .. ':' .. holder, pool)
    if indexed then
      indexed[pool] = true
    end
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

-- What one member of a lease adds to its holder's sum of ids: the first 32 bits of the lease
-- id (random hex; the core computes the same, `LeaseRecord::id_value`). Exact in a Lua number
-- up to 2^21 members per holder in a tag.
local function id_value(member)
  return tonumber(string.sub(member, 1, 8), 16) or 0
end

-- Moves a holder's count of members in a tag by `change`, and its sum of ids by `ids`.
local function count_members(holders, holder, change, ids)
  if change ~= 0 or ids ~= 0 then
    local key = members_key(holders, holder)
    call('HINCRBY', key, 'n', integer(change))
    call('HINCRBY', key, 's', integer(ids))
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
  call('DEL', key)
  call('HSET', key, 'n', integer(count), 's', integer(ids))
  call('PEXPIRE', key, IDLE_MS_TEXT)
  return count
end

-- Rate policies (hit.lua, acquire.lua; docs/design.md, "Rate limits"): a window of SLICES
-- slices, each counted whole while it overlaps the last window.
local SLICES = 10

-- A sliding window's slices in use, oldest first, as {start, units}; stale ones are dropped.
-- Also the counter's epoch (field 'e', see `take`; nil when it has none yet).
local function slices_in_use(key, slice, window)
  local oldest = math.floor((now - window) / slice)
  local fields = call('HGETALL', key)
  local live, stale, epoch = {}, {}, nil
  for i = 1, #fields, 2 do
    local at = tonumber(fields[i])
    if not at then
      epoch = tonumber(fields[i + 1])
    elseif at < oldest then
      stale[#stale + 1] = fields[i]
    else
      live[#live + 1] = {at, tonumber(fields[i + 1])}
    end
  end
  if #stale > 0 then
    call('HDEL', key, unpack(stale))
  end
  table.sort(live, function(a, b) return a[1] < b[1] end)
  return live, epoch
end

-- ms from now until `units` of the slices in use have left the window.
local function freed_after(live, units, slice, window)
  local freed = 0
  for _, entry in ipairs(live) do
    freed = freed + entry[2]
    if freed >= units then
      return (entry[1] + 1) * slice + window - now
    end
  end
  return 0
end

-- One rate policy's counter: units in use, when an excess frees up, the next reset, and how to
-- take units (returning the bucket they went to and the counter's epoch, so a refund finds them
-- and never lands in a counter rebuilt since, after a reset or a restart: a sliding window's
-- slice and the time its hash was made, a fixed window's end in ms and 0; see settle.lua), tell
-- for how many more ms units taken now count in the window (`counts`, on this server's clock) or
-- repair a missing expiry (see hit.lua for the two algorithms). Every counter can be given
-- back to: a token budget's unused reservation, and the units of a grant nobody took (an
-- acquire cancelled while its call was in flight). The epoch comes with the slices, so keeping
-- it costs a write only when a counter is made.
local function look_rate(key, algorithm, window)
  if algorithm == 's' then
    local slice = math.floor(window / SLICES)
    local live, epoch = slices_in_use(key, slice, window)
    local used = 0
    for _, entry in ipairs(live) do
      used = used + entry[2]
    end
    return {
      used = used,
      wait = function(excess) return freed_after(live, excess, slice, window) end,
      reset = function(units)
        if units == 0 then return 0 end
        if #live == 0 then return slice + window - (now - math.floor(now / slice) * slice) end
        return freed_after(live, 1, slice, window)
      end,
      take = function(cost)
        local bucket = math.floor(now / slice)
        if not epoch then
          epoch = now
          call('HSET', key, 'e', epoch)
        end
        call('HINCRBY', key, bucket, cost)
        call('PEXPIRE', key, window + slice)
        return bucket, epoch
      end,
      -- slices_in_use keeps a slice while its index is at least floor((now - window) / slice)
      counts = function() return (math.floor(now / slice) + 1) * slice + window - now end,
      repair = function()
        if call('PTTL', key) == -1 then call('PEXPIRE', key, window + slice) end
      end,
    }
  end
  local used = tonumber(call('GET', key) or 0)
  local left = call('PTTL', key)
  if used > 0 and left < 0 then -- found without an expiry: the window ends one window from now
    call('PEXPIRE', key, window)
    left = window
  end
  return {
    used = used,
    wait = function() return left > 0 and left or window end,
    reset = function(units)
      if units == 0 then return 0 end
      return left > 0 and left or window
    end,
    take = function(cost)
      call('INCRBY', key, cost)
      if left <= 0 then
        call('PEXPIRE', key, window)
        left = window
      end
      return now + left, 0
    end,
    counts = function() return left end,
    repair = function() end,
  }
end

-- Gives back up to `tokens` taken from a counter into bucket `slot` of counter `epoch` (see
-- look_rate), while that bucket still counts (a slice still in the hash of the same epoch; the
-- same fixed window, to the ms the clocks allow); returns how many.
local function give_back(key, algorithm, slot, epoch, tokens)
  local held
  if algorithm == 's' then
    held = tonumber(call('HGET', key, slot))
    if held and tonumber(call('HGET', key, 'e')) == epoch then
      local back = math.min(held, tokens)
      call('HINCRBY', key, slot, -back)
      return back
    end
    return 0
  end
  local left = call('PTTL', key)
  held = tonumber(call('GET', key))
  if held and left > 0 and math.abs(now + left - slot) <= 2 then
    local back = math.min(held, tokens)
    call('DECRBY', key, back)
    return back
  end
  return 0
end

-- Looks at the policies whose counters are keys[k0..k1] and whose (algorithm, limit, window,
-- cost) are args[a0..]: their states, the 1-based index of
-- the first that cannot take its cost more (0: none) and when it could. `scale` multiplies
-- every cost (0: only looking).
local function look_rates(keys, k0, k1, args, a0, scale)
  if k0 > k1 then
    return NONE, 0, 0
  end
  local states, refused, retry = {}, 0, 0
  for i = k0, k1 do
    local at = a0 + (i - k0) * 4
    local state = look_rate(keys[i], args[at], num(args[at + 2]))
    state.limit = num(args[at + 1])
    state.cost = num(args[at + 3]) * scale
    states[#states + 1] = state
    if refused == 0 and state.used + state.cost > state.limit then
      refused, retry = #states, state.wait(state.used + state.cost - state.limit)
    end
  end
  return states, refused, retry
end

-- Takes each policy's cost (when `take`) and appends each one's units in use, reset (ms), and
-- the bucket and epoch the cost went to (0, 0: none taken) to `reply`.
local function answer_rates(reply, states, take)
  for _, state in ipairs(states) do
    local used, bucket, epoch = state.used, 0, 0
    if take and state.cost > 0 then
      bucket, epoch = state.take(state.cost)
      used = used + state.cost
    else
      state.repair()
    end
    reply[#reply + 1] = used
    reply[#reply + 1] = state.reset(used)
    reply[#reply + 1] = bucket
    reply[#reply + 1] = epoch
  end
end

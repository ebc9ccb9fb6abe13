-- Prelude: rate policies, their counters and what a call takes from them and gives back
-- (hit.lua, acquire.lua, settle.lua, topup.lua; docs/design.md, "Rate limits").

-- A sliding window has SLICES slices, each counted whole while it overlaps the last window.
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

-- Calendar windows ('d' a UTC day, 'w' an ISO week from Monday, 'm' a month from the 1st):
-- fixed windows that end at the next boundary. Days since 1970-01-01 of a date and back
-- (Howard Hinnant's days_from_civil / civil_from_days; the same in rate/calendar.rs).
local DAY_MS = 86400000
local function days_from_civil(y, m, d)
  if m <= 2 then y = y - 1 end
  local era = math.floor(y / 400)
  local yoe = y - era * 400
  local doy = math.floor((153 * ((m + 9) % 12) + 2) / 5) + d - 1
  local doe = yoe * 365 + math.floor(yoe / 4) - math.floor(yoe / 100) + doy
  return era * 146097 + doe - 719468
end
local function civil_from_days(z)
  z = z + 719468
  local era = math.floor(z / 146097)
  local doe = z - era * 146097
  local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524)
    - math.floor(doe / 146096)) / 365)
  local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
  local mp = math.floor((5 * doy + 2) / 153)
  local d = doy - math.floor((153 * mp + 2) / 5) + 1
  local m = mp < 10 and mp + 3 or mp - 9
  local y = yoe + era * 400
  if m <= 2 then y = y + 1 end
  return y, m, d
end

-- ms from now until a fixed window of `algorithm` that starts now ends: `window` for 'f', the
-- next calendar boundary for the others.
local function fixed_span(algorithm, window)
  local days = math.floor(now / DAY_MS)
  local next_day
  if algorithm == 'd' then
    next_day = days + 1
  elseif algorithm == 'w' then -- 1970-01-01 was a Thursday: days + 3 counts from a Monday
    next_day = days - (days + 3) % 7 + 7
  elseif algorithm == 'm' then
    local y, m = civil_from_days(days)
    if m == 12 then y, m = y + 1, 1 else m = m + 1 end
    next_day = days_from_civil(y, m, 1)
  else
    return window
  end
  return next_day * DAY_MS - now
end

-- A fixed window's counter is a hash of its units in use ('c') and its window's end ('x', ms on
-- the scripts' clock, `now`), expiring then (PEXPIREAT). A refund finds its window by that end,
-- exactly: PTTL is no measure of it, as Redis 7.0 computes PTTL on its clock at the command's
-- own time, ms after `now` late in a big batch. Returns the units in use and the end of a window
-- that has not ended (0, nil: none), and whether the key is there. `span`: ms to the end of a
-- window starting now (fixed_span; nil in a refund of a plain fixed window, which knows none).
local function read_fixed(key, algorithm, span)
  local fields = redis.pcall('HMGET', key, 'c', 'x')
  if fields.err then
    -- A counter kept as a string (units; the window's end in its expiry), the format a rolling
    -- upgrade finds in a live Redis: rewritten as the hash, its units kept, its end taken from
    -- PTTL (a calendar window's: the next boundary, where it expires; one found without an
    -- expiry gets a full window from now, as look_rate gives it, or waits for it).
    local used, left = tonumber(call('GET', key)) or 0, call('PTTL', key)
    local ends = algorithm == 'f' and left > 0 and now + left or span and now + span
    if not ends then return 0, nil, false end
    call('DEL', key)
    call('HSET', key, 'c', used, 'x', integer(ends))
    call('PEXPIREAT', key, ends)
    return used, ends, true
  end
  local ends = tonumber(fields[2])
  if not ends then return 0, nil, false end
  if ends <= now then return 0, nil, true end
  return tonumber(fields[1]) or 0, ends, true
end

-- One rate policy's counter: units in use, when an excess frees up, the next reset, and how to
-- take units (returning the bucket they went to and the counter's epoch, so a refund finds them
-- and never lands in a counter rebuilt since, after a reset or a restart: a sliding window's
-- slice and the time its hash was made, a fixed window's end in ms and 0; see settle.lua), tell
-- for how many more ms units taken now count in the window (`counts`, on this server's clock) and
-- their bucket stays the one units go to (`current`: the slice, or the window), or
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
      current = function() return (math.floor(now / slice) + 1) * slice - now end,
      repair = function()
        if call('PTTL', key) == -1 then call('PEXPIRE', key, window + slice) end
      end,
    }
  end
  local span = fixed_span(algorithm, window)
  local used, ends, there = read_fixed(key, algorithm, span)
  local left = ends and ends - now or span
  return {
    used = used,
    wait = function() return left end,
    reset = function(units)
      if units == 0 then return 0 end
      return left
    end,
    take = function(cost)
      if ends then
        call('HINCRBY', key, 'c', cost)
      else
        ends = now + span
        call('HSET', key, 'c', cost, 'x', integer(ends))
        call('PEXPIREAT', key, ends)
        there = true
      end
      return ends, 0
    end,
    counts = function() return left end,
    current = function() return left end,
    -- a counter found without an expiry (an operator's PERSIST, a restore) gets its end back
    -- (one that has ended goes: PEXPIREAT in the past deletes)
    repair = function()
      if there and call('PTTL', key) == -1 then
        call('PEXPIREAT', key, ends or now)
      end
    end,
  }
end

-- Gives back up to `tokens` taken from a counter into bucket `slot` of counter `epoch` (see
-- look_rate), while that bucket still counts (a slice still in the hash of the same epoch; a
-- fixed window of that very end, which has not ended); returns how many.
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
  local ends
  held, ends = read_fixed(key, algorithm, algorithm ~= 'f' and fixed_span(algorithm, 0) or nil)
  if ends == slot then
    local back = math.min(held, tokens)
    call('HINCRBY', key, 'c', -back)
    return back
  end
  return 0
end

-- Arguments per policy in a call: algorithm, limit, window in ms, cost (or, in a hit that leases
-- units to its process, 'cost ahead': the units to take beyond the cost when the hit is allowed,
-- as many as fit in half of the room the cost leaves), enforce ('1'; '0': a dry
-- run, counted and reported but never refusing), followed in the same argument, when the app
-- listens for threshold alerts, by the policy's alert marks: the units of use at which each
-- threshold is reached, ascending ("1 8 10": enforced, alerts at 8 and 10 units).
local RATE_ARGS = 5

-- Which alert marks (state.marks[2..], see RATE_ARGS) `used` units of the policy whose counter
-- is state.key reach that no call told within the window yet, as bits (1: the first mark, 2: the
-- second...). What was told is kept in the hash state.key .. ':told' (mark -> ms from which it is
-- told again: when the units taken now leave the window), so every worker tells each once.
-- Read only by a call that reaches a mark, written only by one that tells one.
local function told_first(state, used)
  local marks, reached = state.marks, {}
  for i = 2, #marks do
    if used < marks[i] then break end
    reached[#reached + 1] = marks[i]
  end
  local told_key = state.key .. ':told'
  local told = call('HMGET', told_key, unpack(reached))
  local bits, fresh, until_ms = 0, {}, now + state.counts()
  for i, mark in ipairs(reached) do
    if not told[i] or tonumber(told[i]) <= now then
      bits = bits + 2 ^ (i - 1)
      fresh[#fresh + 1] = mark
      fresh[#fresh + 1] = until_ms
    end
  end
  if bits > 0 then
    call('HSET', told_key, unpack(fresh))
    call('PEXPIRE', told_key, until_ms - now)
  end
  return bits
end

-- Looks at the policies whose counters are keys[k0..k1] and whose RATE_ARGS arguments each are
-- args[a0..]: their states (`over`: no room for the cost), the 1-based index of the first
-- enforced one that cannot take its cost more (0: none) and when it could. `scale` multiplies
-- every cost (0: only looking).
local function look_rates(keys, k0, k1, args, a0, scale)
  if k0 > k1 then
    return NONE, 0, 0
  end
  local states, refused, retry = {}, 0, 0
  for i = k0, k1 do
    local at = a0 + (i - k0) * RATE_ARGS
    local state = look_rate(keys[i], args[at], num(args[at + 2]))
    local enforce = args[at + 4]
    local asked = shape_of(args[at + 3])
    state.limit = num(args[at + 1])
    state.cost = asked[1] * scale
    if asked[2] then
      state.ahead = asked[2] * scale
    end
    state.over = state.used + state.cost > state.limit
    if #enforce > 1 then
      state.key, state.marks = keys[i], shape_of(enforce)
    end
    states[#states + 1] = state
    if refused == 0 and state.over and string.byte(enforce) == 49 then -- '1': enforced
      refused, retry = #states, state.wait(state.used + state.cost - state.limit)
    end
  end
  return states, refused, retry
end

-- Takes each policy's cost (when `take`, a dry run's whatever its room) and appends each one's
-- units in use, reset (ms), the bucket and epoch the cost went to (0, 0: none taken), and its
-- flags to `reply`: 1 when it had no room for the cost, plus twice the bits of the alert marks
-- the units in use reached first in the window (told_first; only when `take`). A policy asked
-- for units ahead (see RATE_ARGS) takes them with the cost and appends two numbers more: how
-- many it took ahead (counted in `used`), and for how many ms their bucket stays current.
local function answer_rates(reply, states, take)
  for _, state in ipairs(states) do
    local used, bucket, epoch, ahead = state.used, 0, 0, 0
    if take and state.cost > 0 then
      if state.ahead then
        ahead = math.max(0, math.min(state.ahead, math.floor((state.limit - used - state.cost) / 2)))
      end
      bucket, epoch = state.take(state.cost + ahead)
      used = used + state.cost + ahead
    else
      state.repair()
    end
    local flags = state.over and 1 or 0
    if take and state.marks and used >= state.marks[2] then
      flags = flags + 2 * told_first(state, used)
    end
    reply[#reply + 1] = used
    reply[#reply + 1] = state.reset(used)
    reply[#reply + 1] = bucket
    reply[#reply + 1] = epoch
    reply[#reply + 1] = flags
    if state.ahead then
      reply[#reply + 1] = ahead
      reply[#reply + 1] = ahead > 0 and state.current() or 0
    end
  end
end

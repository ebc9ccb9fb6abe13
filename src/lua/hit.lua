-- Count one hit against several rate policies of one identity at once, all or nothing: a hit
-- refused by one policy consumes from none. Design: docs/design.md ("Rate limits").
-- KEYS[i]: the counter of policy i (same hash tag).
-- ARGV[1]: cost (units the hit takes from every policy); ARGV[2]: '1' to consume when every
-- policy allows, '0' to only look (peek); then per policy: algorithm ('s' sliding window, 'f'
-- fixed window), limit, window in ms.
-- Sliding window: the counter is a hash of SLICES + 1 slices (slice start / slice length ->
-- units); every slice that overlaps the last window counts in full, so no window of that
-- length ever holds more than the limit (a hit may be refused up to one slice early).
-- Fixed window (the article's): a string counter whose expiry ends the window, started by the
-- first hit; a counter found without expiry gets one (repaired), so no key is left forever.
-- Returns {refused, retry_ms, remaining_1, reset_ms_1, ..., remaining_n, reset_ms_n}: refused is
-- the 1-based index of the first policy that refused (0: allowed), retry_ms when that policy
-- has room for the cost again; remaining counts after this hit (before it when refused or only
-- looking), reset_ms is when the policy's next units free up (0: nothing in use).
local SLICES = 10
local cost = tonumber(ARGV[1])
local consume = ARGV[2] == '1'
read_clock()

-- A sliding window's slices in use, oldest first, as {start, units}; stale ones are dropped.
local function slices_in_use(key, slice, window)
  local oldest = math.floor((now - window) / slice)
  local fields = redis.call('HGETALL', key)
  local live, stale = {}, {}
  for i = 1, #fields, 2 do
    local at = tonumber(fields[i])
    if at < oldest then
      stale[#stale + 1] = fields[i]
    else
      live[#live + 1] = {at, tonumber(fields[i + 1])}
    end
  end
  if #stale > 0 then
    redis.call('HDEL', key, unpack(stale))
  end
  table.sort(live, function(a, b) return a[1] < b[1] end)
  return live
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

-- One policy's state: units in use, when `cost` more fit again, and how to consume.
local function look(key, algorithm, window)
  if algorithm == 's' then
    local slice = math.floor(window / SLICES)
    local live = slices_in_use(key, slice, window)
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
      take = function()
        redis.call('HINCRBY', key, math.floor(now / slice), cost)
        redis.call('PEXPIRE', key, window + slice)
      end,
      repair = function()
        if redis.call('PTTL', key) == -1 then redis.call('PEXPIRE', key, window + slice) end
      end,
    }
  end
  local used = tonumber(redis.call('GET', key) or 0)
  local left = redis.call('PTTL', key)
  if used > 0 and left < 0 then -- found without an expiry: the window ends one window from now
    redis.call('PEXPIRE', key, window)
    left = window
  end
  return {
    used = used,
    wait = function() return left > 0 and left or window end,
    reset = function(units)
      if units == 0 then return 0 end
      return left > 0 and left or window
    end,
    take = function()
      redis.call('INCRBY', key, cost)
      if left <= 0 then redis.call('PEXPIRE', key, window) end
    end,
    repair = function() end,
  }
end

local states, refused, retry = {}, 0, 0
for i, key in ipairs(KEYS) do
  local at = 3 + (i - 1) * 3
  local limit = tonumber(ARGV[at + 1])
  local state = look(key, ARGV[at], tonumber(ARGV[at + 2]))
  state.limit = limit
  states[i] = state
  if refused == 0 and state.used + cost > limit then
    refused, retry = i, state.wait(state.used + cost - limit)
  end
end
local taken = consume and refused == 0
local reply = {refused, retry}
for i, state in ipairs(states) do
  local used = state.used
  if taken then
    state.take()
    used = used + cost
  else
    state.repair()
  end
  reply[#reply + 1] = math.max(state.limit - used, 0)
  reply[#reply + 1] = state.reset(used)
end
return reply

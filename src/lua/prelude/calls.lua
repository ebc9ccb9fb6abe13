-- Prelude, first part: what every call starts from, and how it reads its arguments.
-- The prelude goes in front of every script (src/backend/redis/scripts.rs assembles it, its
-- parts in order: calls, batches, clock, holders, reaping, lines, rates; each part uses only
-- what the parts before it define). Lua in Redis has no modules: the parts are concatenated.
-- Design: docs/design.md (the keys, the holder and lease states, the invariants).

-- A call's state. In the function library every script shares the prelude's state across
-- calls, so begin_call resets it at the start of each (a script of its own starts anew).
-- redis.call, kept in a local by begin_call (a library loads without it): reached through the
-- globals on every command, it cost two table lookups each time.
local call
-- The server's time in ms, read by `read_clock()` (clock.lua) in the scripts that need it (not
-- in release or leave, which run for every stream), as a number and as text; and in µs (exact
-- in a Lua number until the year 2255).
local now, now_text, now_us
-- The tag whose holders the clock-step guard (clock.lua's `steady_clock`) has seen to in this
-- call, if any.
local steadied
-- Members of dead holders removed per call at most, by the reaper and the walks together
-- (reaping.lua), so one call never blocks Redis for long however many members a holder left;
-- the rest goes on the next calls.
local REAP_BUDGET = 1000
local reap_left = REAP_BUDGET
local function begin_call()
  call = redis.call
  now, now_text, now_us = nil, nil, nil
  steadied = nil
  reap_left = REAP_BUDGET
end

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

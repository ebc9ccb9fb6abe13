-- Prelude: the server's clock, and the idle expiry of every key.

-- Reads the server's time into `now`, `now_text` and `now_us` (calls.lua).
local function read_clock()
  local t = call('TIME')
  local seconds, micros = tonumber(t[1]), tonumber(t[2])
  local ms = math.floor(micros / 1000)
  now = seconds * 1000 + ms
  now_text = t[1] .. string.format('%03d', ms)
  now_us = seconds * 1000000 + micros
end

-- Reads the clock unless the call has: an acquire that trusts its holder's entry (acquire.lua)
-- reads it only on the paths that need it, and each of those asks here first.
local function need_clock()
  if not now then
    read_clock()
  end
end
-- Keys live an hour past their last write: those of a fleet that died vanish by themselves,
-- and live holders refresh theirs (acquires, keepalives).
local IDLE_MS = 3600000
local IDLE_MS_TEXT = IDLE_MS .. '' -- as text (string.format is absent while a library loads)

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
  need_clock()
  steadied = holders
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

-- The guard once per call, where a script judges a holder's liveness only now and then
-- (acquire.lua: when its own entry looks expired, or a pool looks full).
local function steady_clock_once(holders, lease)
  if steadied ~= holders then
    steady_clock(holders, lease)
  end
end

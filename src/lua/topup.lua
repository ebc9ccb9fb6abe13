-- Top up the reservations of many streams' token budgets in one call (docs/design.md, "Token
-- budgets"): each entry takes the same tokens from every budget it names, as many as all of them
-- have room for, up to what it wants (or all it wants, forced: a stream that finishes past its
-- budget carries the overage into the window).
-- KEYS: the budgets' counters (one hash slot in a cluster).
-- ARGV: per entry: tokens wanted, '1' if forced else '0', k, then per budget: its KEYS index,
-- algorithm, limit, window in ms (as in hit.lua).
-- Returns, per entry: tokens granted (0 to want), then the bucket each budget's share went to
-- (see the prelude's look_rate; 0 when nothing was granted).
read_clock()
local reply = {}
local at = 1
while at <= #ARGV do
  local want, forced, k = tonumber(ARGV[at]), ARGV[at + 1] == '1', tonumber(ARGV[at + 2])
  at = at + 3
  local states = {}
  local granted = want
  for i = 1, k do
    local state = look_rate(KEYS[tonumber(ARGV[at])], ARGV[at + 1], tonumber(ARGV[at + 3]))
    local limit = tonumber(ARGV[at + 2])
    if not forced then
      granted = math.min(granted, math.max(limit - state.used, 0))
    end
    states[i] = state
    at = at + 4
  end
  reply[#reply + 1] = granted
  for i = 1, k do
    reply[#reply + 1] = granted > 0 and states[i].take(granted) or 0
  end
end
return reply

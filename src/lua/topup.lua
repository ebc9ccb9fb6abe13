-- Top up the token budgets of many streams in one call, every round while they stream
-- (docs/design.md, "Token budgets"). Each entry first gives back what it lists (the reservation
-- of the tokens its stream streamed since the last round, and a roll's: units held in buckets
-- about to leave their window), then takes the units of the tokens streamed since the last
-- round in the current bucket whatever the room (they streamed now: they count now), then as
-- many more answer tokens as every budget it names has room for, up to what it wants (all it
-- wants when forced: a stream that finishes past its budget carries the overage into the
-- window). A budget counts tokens (a price of a million units per million tokens) or money: its
-- price per million answer tokens, a grant's units rounded up (budget/price.rs).
-- KEYS: the budgets' counters (one hash slot in a cluster).
-- ARGV: per entry: answer tokens wanted, '1' if forced else '0', k, then per budget: its KEYS
-- index, algorithm, limit, window in ms (as in hit.lua), units moved, units per million answer
-- tokens, r, and r (slot, epoch, units) to give back.
-- Returns, per entry: tokens granted beyond the streamed ones (0 to want), the answer tokens its
-- budgets have room for after it (the least of them, 0 when none), then per budget the bucket
-- and epoch its share went to (see the prelude's look_rate) and for how many more ms that
-- bucket counts in the window (0, 0, 0 when nothing was taken).
local PER_TOKENS = 1000000
local MOST_TOKENS = 1000000000000

-- Units of `tokens` answer tokens at `price` per million, rounded up (price.rs's units_for).
local function units_for(tokens, price)
  if price == PER_TOKENS then
    return tokens
  end
  return math.ceil(tokens * price / PER_TOKENS)
end

-- The most answer tokens `units` pay for at `price` per million (price.rs's tokens_within).
local function tokens_within(units, price)
  if price == PER_TOKENS then
    return units
  elseif price == 0 then
    return MOST_TOKENS
  end
  return math.min(math.floor(units * PER_TOKENS / price), MOST_TOKENS)
end

read_clock()
local reply = {}
local at = 1
while at <= #ARGV do
  local want, forced, k = tonumber(ARGV[at]), ARGV[at + 1] == '1', tonumber(ARGV[at + 2])
  at = at + 3
  local states, moved, prices, left = {}, {}, {}, {}
  local granted = want
  for i = 1, k do
    local key, algorithm = KEYS[tonumber(ARGV[at])], ARGV[at + 1]
    moved[i], prices[i] = tonumber(ARGV[at + 4]), tonumber(ARGV[at + 5])
    local r = tonumber(ARGV[at + 6])
    for j = at + 7, at + 4 + 3 * r, 3 do
      give_back(key, algorithm, tonumber(ARGV[j]), tonumber(ARGV[j + 1]), tonumber(ARGV[j + 2]))
    end
    local state = look_rate(key, algorithm, tonumber(ARGV[at + 3]))
    left[i] = math.max(tonumber(ARGV[at + 2]) - state.used - moved[i], 0)
    if not forced then
      granted = math.min(granted, tokens_within(left[i], prices[i]))
    end
    states[i] = state
    at = at + 7 + 3 * r
  end
  local room, taken = nil, {}
  for i = 1, k do
    taken[i] = units_for(granted, prices[i])
    local after = tokens_within(math.max(left[i] - taken[i], 0), prices[i])
    room = room and math.min(room, after) or after
  end
  reply[#reply + 1] = granted
  reply[#reply + 1] = room or 0
  for i = 1, k do
    local bucket, epoch, counts = 0, 0, 0
    if moved[i] + taken[i] > 0 then
      bucket, epoch = states[i].take(moved[i] + taken[i])
      counts = states[i].counts()
    end
    reply[#reply + 1] = bucket
    reply[#reply + 1] = epoch
    reply[#reply + 1] = counts
  end
end
return reply

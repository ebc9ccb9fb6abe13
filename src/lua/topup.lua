-- Top up the token budgets of many streams in one call, every round while they stream
-- (docs/design.md, "Token budgets"). Each entry first gives back what it lists (the reservation
-- of the tokens its stream streamed since the last round, and a roll's: tokens held in buckets
-- about to leave their window), then takes the tokens streamed since the last round in the
-- current bucket whatever the room (they streamed now: they count now), then as many more as
-- every budget it names has room for, up to what it wants (all it wants when forced: a stream
-- that finishes past its budget carries the overage into the window).
-- KEYS: the budgets' counters (one hash slot in a cluster).
-- ARGV: per entry: tokens wanted, '1' if forced else '0', tokens streamed since the last round,
-- k, then per budget: its KEYS index, algorithm, limit, window in ms (as in hit.lua), r, and r
-- (slot, epoch, tokens) to give back.
-- Returns, per entry: tokens granted beyond the streamed ones (0 to want), the room its budgets
-- have left after it (the least of them, 0 when none), then per budget the bucket and epoch its
-- share went to (see the prelude's look_rate) and for how many more ms that bucket counts in
-- the window (0, 0, 0 when nothing was taken).
read_clock()
local reply = {}
local at = 1
while at <= #ARGV do
  local want, forced = tonumber(ARGV[at]), ARGV[at + 1] == '1'
  local moved, k = tonumber(ARGV[at + 2]), tonumber(ARGV[at + 3])
  at = at + 4
  local states = {}
  local granted, room = want, nil
  for i = 1, k do
    local key, algorithm = KEYS[tonumber(ARGV[at])], ARGV[at + 1]
    local r = tonumber(ARGV[at + 4])
    for j = at + 5, at + 2 + 3 * r, 3 do
      give_back(key, algorithm, tonumber(ARGV[j]), tonumber(ARGV[j + 1]), tonumber(ARGV[j + 2]))
    end
    local state = look_rate(key, algorithm, tonumber(ARGV[at + 3]))
    local left = math.max(tonumber(ARGV[at + 2]) - state.used - moved, 0)
    room = room and math.min(room, left) or left
    states[i] = state
    at = at + 5 + 3 * r
  end
  if not forced then
    granted = math.min(granted, room)
  end
  reply[#reply + 1] = granted
  reply[#reply + 1] = math.max(room - granted, 0)
  for i = 1, k do
    local bucket, epoch, counts = 0, 0, 0
    if moved + granted > 0 then
      bucket, epoch = states[i].take(moved + granted)
      counts = states[i].counts()
    end
    reply[#reply + 1] = bucket
    reply[#reply + 1] = epoch
    reply[#reply + 1] = counts
  end
end
return reply

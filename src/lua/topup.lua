-- Top up the reservations of many streams' token budgets in one call (docs/design.md, "Token
-- budgets"): each entry takes the same tokens from every budget it names, as many as all of them
-- have room for, up to what it wants (or all it wants, forced: a stream that finishes past its
-- budget carries the overage into the window). An entry may first give back tokens it holds in
-- buckets about to leave their window (a roll: what it gives back it wants again, now).
-- KEYS: the budgets' counters (one hash slot in a cluster).
-- ARGV: per entry: tokens wanted, '1' if forced else '0', k, then per budget: its KEYS index,
-- algorithm, limit, window in ms (as in hit.lua), r, and r (slot, epoch, tokens) to give back.
-- Returns, per entry: tokens granted (0 to want), the room its budgets have left after it (the
-- least of them, 0 when none), then the bucket and epoch each budget's share went to (see the
-- prelude's look_rate; 0, 0 when nothing was granted).
read_clock()
local reply = {}
local at = 1
while at <= #ARGV do
  local want, forced, k = tonumber(ARGV[at]), ARGV[at + 1] == '1', tonumber(ARGV[at + 2])
  at = at + 3
  local states = {}
  local granted, room = want, nil
  for i = 1, k do
    local key, algorithm = KEYS[tonumber(ARGV[at])], ARGV[at + 1]
    local r = tonumber(ARGV[at + 4])
    for j = at + 5, at + 2 + 3 * r, 3 do
      give_back(key, algorithm, tonumber(ARGV[j]), tonumber(ARGV[j + 1]), tonumber(ARGV[j + 2]))
    end
    local state = look_rate(key, algorithm, tonumber(ARGV[at + 3]))
    local left = math.max(tonumber(ARGV[at + 2]) - state.used, 0)
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
    local bucket, epoch = 0, 0
    if granted > 0 then
      bucket, epoch = states[i].take(granted)
    end
    reply[#reply + 1] = bucket
    reply[#reply + 1] = epoch
  end
end
return reply

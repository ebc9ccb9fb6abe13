-- Prelude: a call that decides a batch of requests (acquire.lua, hit.lua), and the acquire
-- script's reply codes, which a request whose decision failed gets one of.

-- The acquire script's reply codes (mirrored in src/backend/redis/acquire.rs).
local REFUSED, GRANTED, WAIT, RATE_LIMITED, BANNED, LINE_FULL, FAILED = 0, 1, 2, 3, 4, 5, 6

-- The text of an error a pcall caught: a command's error is {err = ...}.
local function error_text(e)
  return type(e) == 'table' and e.err or tostring(e)
end

-- A batch's layout: ARGV[1], its frame (a shape, see shape_of): m, the number of requests; how
-- many keys and arguments the head has, what every request of the batch shares (acquire.lua's
-- tag, line, holder...: sent once, read by the script itself); then for each request r, how many
-- keys and arguments it has. Then the head's arguments, from ARGV[2] on (its keys first in
-- KEYS); then the requests' arguments, in order; then (in KEYS, after the head's) their keys, in
-- order. Calls decide(KEYS, kb, kn, ARGV, ab) for each, in order: the request's keys are
-- KEYS[kb + 1 .. kb + kn], its arguments ARGV[ab + 1 ..] (read in place: a copy per request
-- would cost more than the rest of its decision). Returns each one's reply, in a list, or for a
-- batch of one its reply alone (a list around it costs Redis a table to make and to read, about
-- 3k instructions); a request whose decision failed (a key of another type, say) gets
-- {FAILED, message} (as an error reply it would fail the whole reply in a client), and the
-- others are decided all the same.
local function decide_each(batch_keys, batch_argv, decide)
  local frame = shape_of(batch_argv[1])
  local requests = frame[1]
  local replies = {}
  local key_base, arg_base = frame[2], 1 + frame[3]
  for r = 1, requests do
    local key_count, arg_count = frame[2 + 2 * r], frame[3 + 2 * r]
    local decided, reply = pcall(decide, batch_keys, key_base, key_count, batch_argv, arg_base)
    if decided then
      replies[r] = reply
    else
      replies[r] = {FAILED, error_text(reply)}
    end
    key_base, arg_base = key_base + key_count, arg_base + arg_count
  end
  if requests == 1 then
    return replies[1]
  end
  return replies
end

-- Where the request of a call of one finds its keys and arguments, as decide_each would give
-- them (key base, key count, argument base, argument count); nil for a call of several.
local function lone_request(batch_argv)
  local frame = shape_of(batch_argv[1])
  if frame[1] ~= 1 then
    return nil
  end
  return frame[2], frame[4], 1 + frame[3], frame[5]
end

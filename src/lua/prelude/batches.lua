-- Prelude: a call that decides a batch of requests (acquire.lua, hit.lua), and the acquire
-- script's reply codes, which a request whose decision failed gets one of.

-- The acquire script's reply codes (mirrored in src/backend/redis/acquire.rs).
local REFUSED, GRANTED, WAIT, RATE_LIMITED, BANNED, LINE_FULL, FAILED = 0, 1, 2, 3, 4, 5, 6

-- The text of an error a pcall caught: a command's error is {err = ...}.
local function error_text(e)
  return type(e) == 'table' and e.err or tostring(e)
end

-- Request r's counts of keys and of arguments, in a batch (laid out as below) whose head has
-- `head_args` arguments.
local function request_counts(batch_argv, head_args, r)
  local counts = 3 + head_args -- ARGV[counts + 2r - 1], ARGV[counts + 2r]: request r's
  return num(batch_argv[counts + 2 * r - 1]), num(batch_argv[counts + 2 * r])
end

-- A batch's layout: ARGV[1] = m, the number of requests; ARGV[2] and ARGV[3]: how many keys and
-- arguments the head has, what every request of the batch shares (acquire.lua's tag, line,
-- holder...: sent once, read by the script itself), its arguments from ARGV[4] on and its keys
-- first in KEYS; then for each request r, how many keys and arguments it has; then the
-- requests' arguments, in order; then (in KEYS, after the head's) their keys, in order. Calls
-- decide(KEYS, kb, kn, ARGV, ab) for each, in order: the request's keys are KEYS[kb + 1 .. kb +
-- kn], its arguments ARGV[ab + 1 ..] (read in place: a copy per request would cost more than the
-- rest of its decision). Returns each one's reply; a request whose decision failed (a key of
-- another type, say) gets {FAILED, message} (as an error reply it would fail the whole reply in
-- a client), and the others are decided all the same.
local function decide_each(batch_keys, batch_argv, decide)
  local requests, head_args = num(batch_argv[1]), num(batch_argv[3])
  local replies = {}
  local key_base, arg_base = num(batch_argv[2]), 3 + head_args + 2 * requests
  for r = 1, requests do
    local key_count, arg_count = request_counts(batch_argv, head_args, r)
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

-- Where the request of a call of one finds its keys and arguments, as decide_each would give
-- them (key base, key count, argument base, argument count); nil for a call of several.
local function lone_request(batch_argv)
  if batch_argv[1] ~= '1' then
    return nil
  end
  local head_args = num(batch_argv[3])
  local key_count, arg_count = request_counts(batch_argv, head_args, 1)
  return num(batch_argv[2]), key_count, 3 + head_args + 2, arg_count
end

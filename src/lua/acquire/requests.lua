-- acquire.lua, first part: the call's head and the request being decided, read from KEYS and
-- ARGV as acquire.lua's header lays them out, and what the batch does once.
-- (src/backend/redis/scripts.rs puts acquire/requests.lua, acquire/line.lua and acquire.lua in
-- this order after the prelude: each uses what the parts before it define.)

-- What the call's head says (see load_head).
local holders, line, alive, tickets, ttl, queued, channel, holder, fair, own_waits, fencing
-- The process knows its holder's entry has `renew_below` or more left (see load_head).
local trusted
-- A grant extends a holder's entry with less than this many ms left: two renewal periods, so
-- an entry left as it is gets renewed at least once, a period before it would expire (see
-- acquire.lua's grant).
local renew_below
-- The request being decided: where its keys and args are in the call's KEYS and ARGV (its key
-- i is keys[kb + i], its arg j args[ab + j]), and what they say (see load_request).
local keys, kb, key_count, args, ab
local id, waiter, shape, weight, liveness, own, pools, priority, user
local CAPS = 5 -- shape[CAPS + i]: capacity of pool i; shape[CAPS + pools + i]: its line's limit

-- Reads the head: KEYS[1] (KEYS[2..4] with a line) and ARGV[2..4].
local function load_head(call_keys, call_args)
  channel = call_args[2]
  holder = call_args[3] -- the core's decimal text, as stored (holder_name: scores read back)
  local numbers = shape_of(call_args[4])
  ttl = numbers[1]
  queued = numbers[2] == 1
  fair = numbers[3] == 0
  own_waits = numbers[4] == 1
  fencing = numbers[5] == 1
  renew_below = 2 * numbers[6]
  trusted = numbers[7] == 1
  holders = call_keys[1]
  line, alive, tickets = nil, nil, nil
  if queued then
    line, alive, tickets = call_keys[2], call_keys[3], call_keys[4]
  end
end

-- Reads one request, where the prelude's decide_each finds its keys and args.
local function load_request(call_keys, key_base, keys_of_request, call_args, arg_base)
  keys, kb, key_count, args, ab = call_keys, key_base, keys_of_request, call_args, arg_base
  id = args[ab + 1]
  waiter = args[ab + 2]
  shape = shape_of(args[ab + 3])
  weight, liveness, own, pools, priority = shape[1], shape[2], shape[3], shape[4], shape[5]
  -- Who takes turns with others in fair order: the user (its own pool), else the waiter alone.
  user = own > 0 and keys[kb + 1] or waiter
end

-- The capacity of the request's pool i (0 = unlimited).
local function capacity_of(i)
  return shape[CAPS + i]
end

-- The request's rate policies, from look_rates.
local function request_rates(scale)
  if key_count > pools then
    need_clock()
  end
  return look_rates(keys, kb + pools + 1, kb + key_count, args, ab + 5, scale)
end

-- What the batch did once already: the holder's entry extended (nil: not yet; else whether it
-- was live before; the first grant's ZADD serves the others, same clock and lease), the members
-- it was granted (counted once, at the end), the pools in its index, the dead waiters dropped,
-- the slots in use in each pool it looked at (kept up to date by its grants and walks, the only
-- changes to a pool during the call, so a shared pool is counted once per batch).
-- Made anew by each call.
local batch

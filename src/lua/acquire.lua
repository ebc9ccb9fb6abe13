-- Acquire one lease in every pool at once, all or nothing, and count its start against the
-- caller's rate policies in the same step: a start refused for rate takes no slot, a stream
-- refused for a slot consumes no rate. Each capped shared pool has its own line: a request
-- waits (or, not waiting, is refused) only when one of its pools lacks room for it beyond what
-- the waiters before it in that pool's line need; waiters for other pools never hold it up.
-- A pool's line is in order of priority (higher first), then of turns: in fair order users
-- take turns (a user's next waiter gets the turn after the last one served there, or after the
-- user's previous waiter, whichever is later: round robin by user, first come first served
-- within a user); in arrival order the turn is the ticket. Equal places go by waiter id, which
-- the process makes in time order. A user's waiters count against its own quota (see
-- beyond_quota), and a full line gives a user's first waiter the place of the last waiter of
-- the user with the most places there (see make_room).
-- One call decides a batch of such requests, of one holder in one hash slot, one after the other
-- in their order, as as many calls would (packed as the prelude's decide_each says). What a
-- batch needs once is done once: the clock, the holder's entry, its count of members, its index
-- of pools, the dead waiters dropped. Reaping is not an acquire's to pay for (see
-- holder_life): the keep-alives, the count and the walk of a pool that looks full see to it.
-- Design: docs/design.md (the keys, the holder and lease states, the invariants).
-- In front of this file (src/backend/redis/scripts.rs puts them there): acquire/requests.lua,
-- which reads the head and each request from KEYS and ARGV as laid out below, and
-- acquire/line.lua, the waiting lines. This file admits: a request is granted, refused, or
-- waits in line. The helpers above the line `--[[ per call ]]` are defined once, when the
-- library loads; what follows it runs on every call.
-- The head, what every request of the call shares (see the prelude's decide_each):
-- KEYS[1]: the tag's holders (see prelude/holders.lua). With a waiting line (head number 2 = 1),
-- KEYS[2..4]: the line, every waiter of every pool (sorted set: waiter id by ticket; <line>:needs
-- is the hash waiter id -> "<weight> <holder id> <user> <pool key> ...": what it needs, see the
-- prelude's waiter_needs; the capped shared pools it waits for each have a line of their own, see
-- the prelude's pool_line), the liveness of the processes that have waiters (sorted set: holder id
-- by expiry in ms; <liveness>:<holder id> is the set of that process's waiters) and the ticket
-- counter. Its ARGV (from ARGV[2]): 1: the channel to publish on (see the prelude's wake) when a
-- grant leaves others in line (they may fit too); 2: holder id; 3: its numbers, in one argument
-- (the prelude's shape_of): 1: lease duration in ms; 2: 1 if the line's keys are there, else 0;
-- 3: the lines' order, 0 fair, 1 arrival; 4: 1 if a full own pool makes a waiter wait in its
-- own line (wait_for_own_quota) rather than refuses it; 5: 1 if each grant takes a fencing
-- token (see fencing_token), else 0; 6: the holder's renewal period in ms (see grant); 7: 1 if
-- the process knows the holder's entry lives two renewal periods or more (the call trusts it:
-- see the per-call part), else 0.
-- Each request's keys and args:
-- keys 1..n: the pools (sorted sets: member = lease id, score = holder id), all in one hash
-- slot; the first `own` (shape 3) of them are the caller's own quota (a full one refuses at once,
-- never makes it wait), the others shared capacity; then the caller's rate counters (see
-- hit.lua).
-- args 1: lease id; 2: waiter id, or '' for a caller that will not wait; 3: its shape (the
-- prelude's shape_of), the numbers: 1: weight (slots taken in each pool); 2: liveness of the
-- waiter's process in ms (its heartbeat extends it); 3: how many pools are the caller's own
-- quota (0 or 1); 4: n, the number of pools; 5: priority (0 to 9, higher first); 5 + i:
-- capacity of pool i (0 = unlimited); 5 + n + i: the waiters its line holds at most (0: no
-- limit); arg 4: the lease's tally, what its grant adds to its holder's tally (see the prelude's
-- count_lease), as the core computed it, or ''; then, from arg 5, per rate policy: algorithm,
-- limit, window in ms, the units the start takes from it (1 for a request rate, the reservation
-- for a token budget), enforce, as in hit.lua (a dry run never refuses the start, and a grant
-- takes its units whatever its room).
-- Returns per request (in a list; a call of one request, its reply alone: see decide_each)
-- {GRANTED, life, token, used_1, ..., used_n, then per rate policy used, reset_ms,
-- bucket, epoch, over} (life: 0 if the holder's entry was not live when the lease was added
-- (it is written anew: the lease lives a lease duration), else the ms the entry has left after
-- the call, so the holder's other leases in the tag lived on and this one lives that long; in a
-- call that trusts the entry, two renewal periods, what the process knew at least;
-- token: the grant's fencing token, see
-- fencing_token, or 0 when the head asks for none; used: slots in use after the grant; then each rate policy's answer, as hit.lua
-- gives it; a retried call that finds the lease already granted answers
-- with buckets 0); {REFUSED, i, used_i, retry_ms} when pool i refuses; {RATE_LIMITED, i,
-- retry_ms, then per rate policy used, reset_ms, bucket, epoch, over} when rate policy i refuses;
-- {WAIT, ticket, i, used_i, place_1, ..., place_n} when the caller is in line and should wait
-- (i: the first pool without room for it, used_i its slots in use and kept by the waiters before
-- it, at most its capacity, what a refusal says when the wait runs out; then its place in the
-- line of each pool, 0 for a pool without one; lower is earlier); {LINE_FULL, i, waiting,
-- retry_ms} when the line of pool i holds max_waiting waiters already and has no place to give
-- up to the caller (see make_room; retry_ms: the time those would take at the line's recent
-- service rate, or a lease duration before it has one), {LINE_FULL, i, waiting, retry_ms, 1} to
-- a waiter whose place there went to another user's first waiter;
-- {BANNED, ms_left} when an operator banned the user's streams (revoke.lua, the key
-- <own pool>:ban). The codes are the prelude's.
-- The slots in use in each pool of the request being decided (check_pools fills it, grant
-- reads it): one table for every request, since a table made per request cost a fortieth of
-- a batched cycle's instructions.
local USED = {}

-- A grant's fencing token, when the head asks for them (else 0): above every token given before
-- in the tag, so every two leases that share a pool (their keys share the tag) are ordered. One
-- INCR of <holders>:fencing per grant; when that is missing (gone an hour after it was last
-- set, lost in a restart) or more than FENCING_SLACK_US behind the server's TIME in µs, the
-- token is that time instead, set in its place. So tokens only grow while the key lives; never run ahead of the clock (a grant takes
-- far more than a µs); and a key made again, or a promoted replica's copy older than the slack,
-- goes on from the clock: above every token given before unless that clock reads earlier than
-- the old server's did. The set comes about once a second in a busy tag: an INCR per grant is
-- all the rest costs (a GET and a SET per call cost Redis three times as much).
local FENCING_SLACK_US = 1000000
local function fencing_token()
  if not fencing then
    return 0
  end
  need_clock()
  local key = holders .. ':fencing'
  local token = call('INCR', key)
  if token < now_us - FENCING_SLACK_US then
    token = now_us
    call('SET', key, integer(token), 'PX', IDLE_MS_TEXT)
  end
  return token
end

-- A client that resent this call after a dropped connection must not be refused its own slot,
-- nor sent back in line: checked before any answer but a grant.
local function already_granted()
  if not call('ZSCORE', keys[kb + 1], id) then
    return nil
  end
  -- A new token: the first reply, with the first one, was lost on the way.
  local granted = {GRANTED, entry_life(holders, holder), fencing_token()}
  for i = 1, pools do
    granted[i + 3] = call('ZCARD', keys[kb + i])
  end
  answer_rates(granted, (request_rates(0)), false)
  return granted
end

-- Whether the user may be banned: its own pool's <own pool>:ban exists (its PTTL then says).
-- With a line, one EXISTS of both keys says, in the usual case of neither, that there is no ban
-- and that nobody waits (a sorted set that empties is deleted), so the line is not counted again.
local function may_be_banned()
  local ban = keys[kb + 1] .. ':ban'
  if not queued or batch.line_empty ~= nil then
    return call('EXISTS', ban) == 1
  end
  if call('EXISTS', ban, line) == 0 then
    batch.line_empty = true
    return false
  end
  return true
end

-- Refuses the caller with `answer`, out of the line; but a caller that will not wait and
-- resent a call whose grant was made gets that grant again (a waiter was checked first).
local function refuse(answer)
  local granted = waiter == '' and already_granted()
  if granted then
    return granted
  end
  leave_line()
  return answer
end

-- Slots in use in each pool, and the waiters this request would pass; on the first pool
-- without room (beyond what the waiters before it keep there), the answer to give instead of a
-- grant.
local function check_pools(ticket, lined)
  -- Nobody waits at all (the usual case): no line to walk.
  local anyone_waits = queued and anyone_may_wait()
  local used, passing = USED, anyone_waits and {} or NONE
  for i = 1, pools do
    local pool, capacity = keys[kb + i], capacity_of(i)
    used[i] = used_slots(pool, holders, ttl, weight, capacity, batch.used[pool])
    batch.used[pool] = used[i]
    local promised = 0
    if anyone_waits and i <= own and not lined[pool] and waiter == '' then
      -- The user's waiters keep their room in its own quota (see beyond_quota).
      promised = users_waiting()
    elseif anyone_waits and lined[pool] then
      local passing_here = {}
      promised = promised_in(pool, capacity, used[i], passing_here)
      if used[i] + promised + weight > capacity then
        -- Looks full: counted again by live holders, and what the waiters keep with it.
        used[i] = used_slots(pool, holders, ttl, weight + promised, capacity, used[i])
        batch.used[pool] = used[i]
        passing_here = {}
        promised = promised_in(pool, capacity, used[i], passing_here)
      end
      for _, passed in ipairs(passing_here) do
        passing[#passing + 1] = passed
      end
    end
    if capacity > 0 and used[i] + promised + weight > capacity then
      if (i <= own and not own_waits) or waiter == '' then
        -- A slot frees when a lease is released or, at the latest, when a dead holder expires.
        return used, refuse({REFUSED, i, math.min(capacity, used[i] + promised), ttl})
      end
      local wait = {WAIT, ticket, i, math.min(capacity, used[i] + promised)}
      for _, place in ipairs(places(lined)) do
        wait[#wait + 1] = place
      end
      return used, wait
    end
  end
  return used, nil, passing
end

-- The ms the holder's entry has left (0: expired or gone), read once per call. A live one (the
-- usual case) is all an acquire looks at. One found expired or gone (after the clock-step guard:
-- a step of the clock would fool it) may have lost leases whose members are still in the pools:
-- reaped first, or they would come back to life under the new entry, outside its count (the
-- protocol model's `reap_before_rejoining` shows what goes wrong without).
local function holder_life()
  local life = entry_life(holders, holder)
  if life > 0 then
    return life
  end
  steady_clock(holders, ttl)
  life = entry_life(holders, holder)
  if life > 0 then
    return life
  end
  reap(holders)
  return 0
end

-- Adds the lease's members to every pool for this holder, and takes the start from every rate
-- policy. The first grant of the call writes the holder's entry when it is gone, expired, or
-- has less than two renewal periods left (renew_below); one the keep-alive renews is left to
-- it, and the reply tells the process its life, from which the process dates the grant's
-- deadline (the protocol model's `grant_dated_by_entry`).
local function grant(used, rates)
  local life = batch.life
  if not batch.joined then
    if life < renew_below then
      hold(holders, holder, ttl, life > 0)
      batch.life = ttl
      life = life > 0 and ttl or 0
    end
    batch.joined = true
  end
  local granted = {GRANTED, life, fencing_token()}
  index_pools(holders, holder, keys, kb + 1, kb + pools, batch.indexed)
  for i = 1, pools do
    local pool = keys[kb + i]
    -- Counted first: a grant that fails half way never lets the batch count too few.
    batch.used[pool] = used[i] + weight
    add_members(pool, holder, id, weight)
    granted[i + 3] = used[i] + weight
  end
  batch.granted_members = batch.granted_members + weight * pools
  batch.granted_ids = batch.granted_ids + weight * pools * id_value(id)
  answer_rates(granted, rates, true)
  return granted
end


-- Decides the request loaded.
local function decide()
  -- A waiter checks first: a resent call must not put it back in line; nor one whose place
  -- went to another user's waiter.
  if waiter ~= '' then
    local answer = already_granted() or (queued and given_up())
    if answer then
      return answer
    end
  end

  -- A banned user: refused before anything else is looked at or taken.
  if own > 0 and may_be_banned() then
    local ban = call('PTTL', keys[kb + 1] .. ':ban')
    if ban > 0 then
      return refuse({BANNED, ban})
    end
  end

  -- Over a rate limit: refused before taking a place in line or a slot.
  local rates, rate_refused, rate_retry = request_rates(1)
  if rate_refused > 0 then
    local refused = {RATE_LIMITED, rate_refused, rate_retry}
    answer_rates(refused, rates, false)
    return refuse(refused)
  end

  -- The capped pools with a line matter only when someone may wait (not the usual case).
  local ticket, lined = 0, NONE
  if queued and (waiter ~= '' or anyone_may_wait()) then
    need_clock()
    drop_dead_waiters()
    lined = lined_pools()
    if waiter ~= '' then
      if not call('ZSCORE', line, waiter) then
        local refused = beyond_quota() or make_room(lined)
        if refused then
          return refused
        end
      end
      ticket = enter_line(lined)
    end
  end

  local used, instead, passing = check_pools(ticket, lined)
  if instead then
    return instead
  end

  local granted = grant(used, rates)
  for _, passed in ipairs(passing) do
    call('HINCRBY', pool_passed(passed[1]), passed[2], weight)
    call('PEXPIRE', pool_passed(passed[1]), math.max(ttl, liveness) * 2)
  end
  if queued and waiter ~= '' then
    served(lined)
    leave_line()
    if call('ZCARD', line) > 0 then
      wake(channel, 0)
    end
  end
  return granted
end

-- Loads and decides one request of the call.
local function decide_request(call_keys, key_base, keys_of_request, call_args, arg_base)
  load_request(call_keys, key_base, keys_of_request, call_args, arg_base)
  return decide()
end

-- Whether nothing but room stands between the request loaded and a grant: no ban on its user,
-- nobody in line (one EXISTS of both keys, as may_be_banned).
local function unhindered()
  if own > 0 and queued then
    return call('EXISTS', keys[kb + 1] .. ':ban', line) == 0
  elseif own > 0 then
    return call('EXISTS', keys[kb + 1] .. ':ban') == 0
  end
  return not queued or call('EXISTS', line) == 0
end

-- The call's reply when it holds one request the common way (a caller that does not wait, no
-- rate policy, no fencing token) in a call that trusts its holder's entry, and nothing but room
-- matters: no ban, nobody in line, every pool with room by its plain count. That is the path
-- decide takes there, run without the batch's bookkeeping (its tables, the pcall per request,
-- the list of replies: two fifths of a lone acquire's Redis work). nil for any other call, or
-- when a ban, a line or a pool that looks full is to be seen to: decide then starts over, as
-- only reads were made.
local function grant_lone(call_keys, call_args)
  local key_base, key_count, arg_base, arg_count = lone_request(call_args)
  if not key_base or arg_count ~= 4 or fencing then
    return nil
  end
  load_request(call_keys, key_base, key_count, call_args, arg_base)
  if waiter ~= '' or not unhindered() then
    return nil
  end
  local granted = {GRANTED, renew_below, 0}
  for i = 1, pools do
    local used, capacity = call('ZCARD', keys[kb + i]), capacity_of(i)
    if capacity > 0 and used + weight > capacity then
      return nil
    end
    granted[i + 3] = used + weight
  end
  index_pools(holders, holder, keys, kb + 1, kb + pools, nil)
  for i = 1, pools do
    add_members(keys[kb + i], holder, id, weight)
  end
  count_lease(holders, holder, args[ab + 4], weight * pools, id)
  return granted
end

--[[ per call ]]
-- The call decides each request in order (the prelude's decide_each packs and unpacks them);
-- the clock, the holder's entry and its count of members (and sum of ids) are seen to once.
-- When the process knows the entry lives two renewal periods or more (trusted), the grants
-- leave it to the keep-alive, and the process dates them from what it knows (their replies'
-- life is not read); no clock is read for it: the paths that need the clock read it
-- (need_clock). A lone request the common way is granted first without the batch's
-- bookkeeping, when nothing but room matters (grant_lone).
load_head(KEYS, ARGV)
if trusted then
  local done, lone = pcall(grant_lone, KEYS, ARGV)
  if not done then
    return {FAILED, error_text(lone)}
  elseif lone then
    return lone
  end
end
batch = {joined = false, granted_members = 0, granted_ids = 0, indexed = {}, waiters_dropped = false, used = {}}
if trusted then
  batch.life = renew_below
else
  read_clock()
  batch.life = holder_life()
end
local found_alive = batch.life > 0
local replies = decide_each(KEYS, ARGV, decide_request)
count_members(holders, holder, batch.granted_members, batch.granted_ids)
if batch.joined and not found_alive then
  refresh(holders, holder) -- its keys may be new
end
return replies

-- Prelude: the waiting lines' keys and what every script that takes waiters out of a line
-- shares (acquire.lua, leave.lua, heartbeat.lua...); how a waiter enters a line and is served
-- is acquire/line.lua's. Also the wake-up of the processes that have waiters.

-- The line of one capped shared pool (sorted set: waiter id by its place, see
-- acquire/line.lua), and its turns (hash: user -> the turn of its last waiter there; '' -> the
-- last turn served; 'at', 'gap': when a waiter was last served and the mean time between two;
-- 'sweep': see acquire/line.lua's sweep_turns).
-- '|' is in no pool name nor key prefix.
local function pool_line(pool)
  return pool .. '|line'
end

local function pool_turns(pool)
  return pool .. '|turns'
end

-- How many slots later requests took past each waiter of a pool's line that did not fit (hash:
-- waiter id -> slots; see acquire/line.lua's promised_in).
local function pool_passed(pool)
  return pool .. '|passed'
end

-- How many places each user has in a pool's line (sorted set: user -> places; see
-- acquire/line.lua's make_room).
local function pool_users(pool)
  return pool .. '|users'
end

-- What a waiter of the line is, from its entry in <line>:needs ("<weight> <holder id> <user>
-- <pool key> ...", see acquire/line.lua's enter_line): its weight, the process it waits in, its
-- user (its own pool's key, or the waiter id without one), and an iterator over the capped
-- pools it waits for.
local function waiter_needs(entry)
  local words = string.gmatch(entry or '', '%S+')
  return tonumber(words() or '0'), words(), words(), words
end

-- Moves a user's count in a sorted set of counts (<line>:users, a pool's users) by `change`,
-- dropping the user at 0.
local function count_user(counts, user, change)
  if tonumber(call('ZINCRBY', counts, change, user)) <= 0 then
    call('ZREM', counts, user)
  end
end

-- Takes waiters out of the line, and of the lines of the pools they wait for, and forgets what
-- they need and their part in their user's counts (<line>:users, each pool's users). A pool's
-- line left empty forgets its turns and users.
local function forget_waiters(line, waiters)
  for first = 1, #waiters, 1000 do
    local some = {unpack(waiters, first, math.min(first + 999, #waiters))}
    local needs = call('HMGET', line .. ':needs', unpack(some))
    for j, waiter in ipairs(some) do
      local weight, _, user, pools = waiter_needs(needs[j])
      if user then
        count_user(line .. ':users', user, -weight)
      end
      for pool in pools do
        if call('ZREM', pool_line(pool), waiter) == 1 and user then
          count_user(pool_users(pool), user, -1)
        end
        call('HDEL', pool_passed(pool), waiter)
        if call('EXISTS', pool_line(pool)) == 0 then
          call('DEL', pool_turns(pool), pool_passed(pool), pool_users(pool))
        end
      end
    end
    call('ZREM', line, unpack(some))
    call('HDEL', line .. ':needs', unpack(some))
  end
end

-- Wakes the waiters of every process. On a Redis Cluster the channel is sharded (its name comes
-- with a leading '!'): SPUBLISH reaches the SSUBSCRIBEd listeners on the slot's own node
-- instead of every node of the cluster.
local function wake(channel, message)
  if string.sub(channel, 1, 1) == '!' then
    call('SPUBLISH', string.sub(channel, 2), message)
  else
    call('PUBLISH', channel, message)
  end
end

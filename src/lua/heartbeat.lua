-- Keep this process's waiters in the line: one write for all of them (see acquire.lua), so the
-- cost of waiting does not grow with the number of waiters. A waiter this process no longer has
-- (an acquire cancelled while its call was in flight re-entered the line after leaving it) is
-- taken out when two heartbeats in a row miss it: a waiter whose first call ran between this
-- process listing its waiters and this script is listed by the next heartbeat.
-- KEYS[1]: the line; KEYS[2]: the liveness of the processes that have waiters (sorted set:
-- holder id by expiry in ms; KEYS[2]:<holder id> is the set of that process's waiters,
-- KEYS[2]:<holder id>:stray those the last heartbeat missed).
-- ARGV[1]: liveness in ms; ARGV[2]: holder id; ARGV[3..]: the ids of this process's waiters.
-- Returns the ids of this process's waiters whose places went to other users' waiters
-- (KEYS[2]:<holder id>:displaced, see acquire.lua's displace): the process wakes them, and each
-- one's next call answers why.
-- Design: docs/design.md (the keys, the holder and lease states, the invariants).
read_clock()
local line, alive = KEYS[1], KEYS[2]
local mine = alive .. ':' .. holder_name(ARGV[2])
local missed_before = mine .. ':stray'
call('ZADD', alive, 'XX', now + tonumber(ARGV[1]), holder_name(ARGV[2]))
if call('SCARD', mine) > #ARGV - 2 then
  local live = {}
  for i = 3, #ARGV do
    live[ARGV[i]] = true
  end
  local missed = {}
  for _, waiter in ipairs(call('SMEMBERS', missed_before)) do
    missed[waiter] = true
  end
  call('DEL', missed_before)
  for _, waiter in ipairs(call('SMEMBERS', mine)) do
    if not live[waiter] then
      if missed[waiter] then
        forget_waiters(line, {waiter})
        call('SREM', mine, waiter)
      else
        call('SADD', missed_before, waiter)
      end
    end
  end
  call('PEXPIRE', missed_before, 10000)
end
return call('HKEYS', mine .. ':displaced')
